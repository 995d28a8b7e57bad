"""Prometheus metrics of one plugin process, behind methods that take plain Python values.

Every `Metrics` owns its own `CollectorRegistry` instead of prometheus-client's process-wide
default: tests (and `demo`) run several daemons in one process, and the default registry refuses
a second collector with the same name. Callers never touch prometheus-client types, so the
exposition library stays an implementation detail of this module.

Gauges describe the present (devices per resource, GPU health) and are removed with
`forget_resource` when a reload drops a resource, so a dashboard does not keep showing a resource
the node no longer advertises. Counters are never removed: Prometheus' `rate()` expects them to
only grow for the life of the process.

The registry also carries prometheus-client's `process_*`, `python_info` and `python_gc_*`
collectors. Counters and histograms export no `_created` series: prometheus-client only offers a
process-wide switch, turned off when this module is imported (Prometheus ignores them in the text
format, and they double the lines of every labelled counter).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)

from sharing_plugin import installed_version

disable_created_metrics()  # type: ignore[no-untyped-call]

#: The text exposition format `render()` produces (what Prometheus scrapes).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Allocate answers from an in-memory plan: a healthy round trip is well under a millisecond, so the
# buckets start at 50 us; anything past 100 ms means the event loop was blocked.
ALLOCATE_BUCKETS = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
)

_PREFIX = "sharing_plugin"


def _result(ok: bool) -> str:
    return "ok" if ok else "failed"


class Metrics:
    """The plugin's metrics; every method is cheap and safe to call from the event loop."""

    def __init__(
        self, *, version: str | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        """`version` defaults to the installed package's (`sharing_plugin.installed_version`)."""
        self.registry = CollectorRegistry(auto_describe=True)
        self._clock = clock
        r = self.registry
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        self._build_info = Gauge(
            f"{_PREFIX}_build_info",
            "Always 1; labels carry the plugin version.",
            ["version"],
            registry=r,
        )
        self._build_info.labels(version or installed_version()).set(1)
        self._config_info = Gauge(
            f"{_PREFIX}_config_info",
            "Always 1; labels name the config in use (name, source hash, generation).",
            ["name", "hash", "generation"],
            registry=r,
        )
        self._devices = Gauge(
            f"{_PREFIX}_devices",
            "Devices advertised to kubelet per resource (healthy, unhealthy and draining).",
            ["resource"],
            registry=r,
        )
        self._healthy = Gauge(
            f"{_PREFIX}_healthy_devices",
            "Devices advertised as Healthy per resource (kubelet's allocatable).",
            ["resource"],
            registry=r,
        )
        self._draining = Gauge(
            f"{_PREFIX}_draining_devices",
            "Devices a reload dropped that a pod still holds (advertised Unhealthy until freed).",
            ["resource"],
            registry=r,
        )
        self._allocated = Gauge(
            f"{_PREFIX}_devices_allocated",
            "Devices of the resource pods hold (PodResources, plus grants it has not shown yet).",
            ["resource"],
            registry=r,
        )
        self._available = Gauge(
            f"{_PREFIX}_devices_available",
            "Devices advertised Healthy that no pod holds.",
            ["resource"],
            registry=r,
        )
        self._replicas_in_use = Gauge(
            f"{_PREFIX}_gpu_replicas_in_use",
            "Shared replicas (time-slicing or MPS) pods hold on the GPU, all resources together.",
            ["gpu"],
            registry=r,
        )
        self._registered = Gauge(
            f"{_PREFIX}_resource_registered",
            "1 when kubelet accepted the resource's registration, else 0.",
            ["resource"],
            registry=r,
        )
        self._allocations = Counter(
            f"{_PREFIX}_allocations",
            "Allocate calls answered, by resource and result (failed = refused request).",
            ["resource", "result"],
            registry=r,
        )
        self._allocate_seconds = Histogram(
            f"{_PREFIX}_allocate_duration_seconds",
            "Time to answer one Allocate call, measured inside the plugin.",
            ["resource"],
            buckets=ALLOCATE_BUCKETS,
            registry=r,
        )
        self._registrations = Counter(
            f"{_PREFIX}_registrations",
            "Registrations with kubelet, by resource and result.",
            ["resource", "result"],
            registry=r,
        )
        self._pod_resources_errors = Counter(
            f"{_PREFIX}_podresources_errors",
            "PodResources List calls kubelet did not answer (socket absent, call failed); "
            "devices pods hold are then taken as at the last answer.",
            registry=r,
        )
        self._reloads = Counter(
            f"{_PREFIX}_reloads",
            "Config reloads, by result (failed = the previous config kept serving).",
            ["result"],
            registry=r,
        )
        self._reload_successful = Gauge(
            f"{_PREFIX}_config_last_reload_successful",
            "1 when the last config reload was applied, 0 when it was rejected.",
            registry=r,
        )
        self._reload_timestamp = Gauge(
            f"{_PREFIX}_config_last_reload_success_timestamp_seconds",
            "Unix time of the last config reload that was applied.",
            registry=r,
        )
        self._gpu_health_events = Counter(
            f"{_PREFIX}_gpu_health_events",
            "NVML health events received, by GPU UUID and Xid (ignored Xids included).",
            ["gpu", "xid"],
            registry=r,
        )
        self._gpu_ecc_events = Counter(
            f"{_PREFIX}_gpu_ecc_events",
            "NVML ECC error events received, by GPU UUID and kind (single-bit, double-bit).",
            ["gpu", "kind"],
            registry=r,
        )
        self._gpu_healthy = Gauge(
            f"{_PREFIX}_gpu_healthy",
            "1 when the GPU is Healthy, 0 while it is marked Unhealthy.",
            ["gpu"],
            registry=r,
        )
        self._mps_restarts = Counter(
            f"{_PREFIX}_mps_daemon_restarts",
            "Restarts of an MPS resource's control daemon after it died or stopped answering.",
            ["resource"],
            registry=r,
        )
        self._mig_operations = Counter(
            f"{_PREFIX}_mig_operations",
            "MIG instance operations through NVML, by operation and result.",
            ["operation", "result"],
            registry=r,
        )
        self._share_exceeded = Counter(
            f"{_PREFIX}_gpu_share_exceeded_events",
            "Pods found over their memory share of a shared GPU for longer than allowed "
            "(each a GpuShareExceeded Warning Event).",
            ["gpu"],
            registry=r,
        )
        self._caps_late = Counter(
            f"{_PREFIX}_memory_limit_applied_late",
            "GPU memory caps the plugin set itself on a container's cgroup, where the CDI hook "
            "had set none (memoryLimits).",
            ["gpu"],
            registry=r,
        )
        self._allocate_listeners: list[Callable[[str], None]] = []
        self._expositions: list[Callable[[], bytes]] = []

    # --- resources ---------------------------------------------------------------------------

    def set_devices(self, resource: str, *, total: int, healthy: int, draining: int = 0) -> None:
        """Record what the resource advertises right now (call after each ListAndWatch push)."""
        self._devices.labels(resource).set(total)
        self._healthy.labels(resource).set(healthy)
        self._draining.labels(resource).set(draining)

    def set_usage(self, resource: str, *, allocated: int, available: int) -> None:
        """Record how many of the resource's devices pods hold and how many are free."""
        self._allocated.labels(resource).set(allocated)
        self._available.labels(resource).set(available)

    def set_replicas_in_use(self, per_gpu: Mapping[str, int]) -> None:
        """Replicas in use per GPU UUID; GPUs left out (no longer shared) lose their series."""
        self._replicas_in_use.clear()
        for gpu, count in per_gpu.items():
            self._replicas_in_use.labels(gpu).set(count)

    def set_registered(self, resource: str, registered: bool) -> None:
        self._registered.labels(resource).set(1 if registered else 0)

    def forget_resource(self, resource: str) -> None:
        """Drop the gauges of a resource a reload removed; its counters keep their totals."""
        gauges = (
            self._devices,
            self._healthy,
            self._draining,
            self._allocated,
            self._available,
            self._registered,
        )
        for gauge in gauges:
            with contextlib.suppress(KeyError):  # never set: nothing to forget
                gauge.remove(resource)

    def observe_allocate(self, resource: str, seconds: float, *, ok: bool = True) -> None:
        """Count one Allocate call and record how long answering it took."""
        self._allocations.labels(resource, _result(ok)).inc()
        self._allocate_seconds.labels(resource).observe(seconds)
        if ok:
            for listener in self._allocate_listeners:
                listener(resource)

    def on_allocate(self, listener: Callable[[str], None]) -> None:
        """Call `listener(resource)` after each granted Allocate: a pod just got devices,
        which is when watching GPU usage starts to matter (nothing polls before)."""
        self._allocate_listeners.append(listener)

    def count_registration(self, resource: str, *, ok: bool = True) -> None:
        self._registrations.labels(resource, _result(ok)).inc()

    def count_pod_resources_error(self) -> None:
        """Count one PodResources call that got no answer."""
        self._pod_resources_errors.inc()

    # --- config ------------------------------------------------------------------------------

    def set_config(self, *, name: str | None, hash_: str, generation: int) -> None:
        """Record the config now applied; the series of the previous one goes away."""
        self._config_info.clear()
        self._config_info.labels(name or "", hash_, str(generation)).set(1)

    def count_reload(self, ok: bool) -> None:
        """Count one reload attempt; a rejected one leaves the success timestamp where it was."""
        self._reloads.labels(_result(ok)).inc()
        self._reload_successful.set(1 if ok else 0)
        if ok:
            self._reload_timestamp.set(self._clock())

    # --- GPUs and MIG ------------------------------------------------------------------------

    def count_health_event(self, gpu: str, xid: int) -> None:
        self._gpu_health_events.labels(gpu, str(xid)).inc()

    def count_ecc_event(self, gpu: str, kind: str) -> None:
        self._gpu_ecc_events.labels(gpu, kind).inc()

    def set_gpu_healthy(self, gpu: str, healthy: bool) -> None:
        self._gpu_healthy.labels(gpu).set(1 if healthy else 0)

    def count_mig_operation(self, operation: str, *, ok: bool = True) -> None:
        """Count one MIG operation, e.g. ``create-gpu-instance`` or ``destroy-gpu-instance``."""
        self._mig_operations.labels(operation, _result(ok)).inc()

    def count_share_exceeded(self, gpu: str) -> None:
        self._share_exceeded.labels(gpu).inc()

    def count_cap_applied_late(self, gpu: str) -> None:
        self._caps_late.labels(gpu).inc()

    def count_mps_restarts(self, resource: str, restarts: int) -> None:
        """Add `restarts` restarts of `resource`'s MPS control daemon."""
        if restarts > 0:
            self._mps_restarts.labels(resource).inc(restarts)

    # --- exposition --------------------------------------------------------------------------

    def add_exposition(self, source: Callable[[], bytes]) -> None:
        """Series written at scrape time by `source`, in the text format, after the registry's
        (families of their own names: per-pod GPU usage)."""
        self._expositions.append(source)

    def render(self) -> bytes:
        """Every metric in the text exposition format (`CONTENT_TYPE`)."""
        return generate_latest(self.registry) + b"".join(s() for s in self._expositions)
