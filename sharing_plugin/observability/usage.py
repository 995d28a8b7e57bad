"""Per-pod GPU usage as Prometheus series and as the `usage` part of `/status`.

The series are produced at scrape time by a custom collector over the latest `UsageReport`
(made for that scrape, or shared with another within a second), never kept in gauges: a pod
that left has no row in the report, so its series are simply not there at the next scrape.
Rows that share a label set (two MIG devices of one profile on a GPU, held by one container;
the unattributed processes of a device) are summed.

Series (bytes, ratios 0..1; `mig` is the MIG profile, empty for a whole GPU):
`sharing_plugin_pod_gpu_memory_used_bytes`, `sharing_plugin_pod_gpu_memory_share_bytes` and
`sharing_plugin_pod_gpu_utilization_ratio` {namespace, pod, container, resource, gpu, mig};
`sharing_plugin_gpu_memory_used_bytes` and `sharing_plugin_gpu_memory_total_bytes` {gpu};
`sharing_plugin_replica_memory_share_bytes` {resource, gpu, mig};
`sharing_plugin_gpu_share_exceeded_pods` {gpu}.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily

from sharing_plugin.usage.model import ContainerUsage, UsageReport
from sharing_plugin.usage.overshare import PodOnDevice

_PREFIX = "sharing_plugin"
POD_LABELS = ("namespace", "pod", "container", "resource", "gpu", "mig")


@dataclass(frozen=True, slots=True)
class UsageView:
    """What the collector and `/status` show: the report and the pods over their share."""

    report: UsageReport
    exceeded: tuple[PodOnDevice, ...] = ()
    at: str = ""  # RFC 3339, when the report was read


class UsageCollector:
    """Yields the usage series of `view()` (None: nothing read yet, families without series)."""

    def __init__(self, view: Callable[[], UsageView | None]) -> None:
        self._view = view

    def describe(self) -> Iterator[Any]:
        return iter(())  # registered without a first collect(): that would read NVML

    def collect(self) -> Iterator[GaugeMetricFamily]:
        view = self._view()
        used = _family("pod_gpu_memory_used_bytes", "GPU memory the pod's processes use.")
        share = _family(
            "pod_gpu_memory_share_bytes",
            "GPU memory the replicas the container holds entitle it to (0: holds none there).",
        )
        utilization = _family(
            "pod_gpu_utilization_ratio",
            "SM utilization of the container's processes over NVML's last second (0..1).",
        )
        gpu_used = GaugeMetricFamily(
            f"{_PREFIX}_gpu_memory_used_bytes", "GPU memory in use (NVML).", labels=["gpu"]
        )
        gpu_total = GaugeMetricFamily(
            f"{_PREFIX}_gpu_memory_total_bytes", "GPU memory (NVML).", labels=["gpu"]
        )
        replica = GaugeMetricFamily(
            f"{_PREFIX}_replica_memory_share_bytes",
            "GPU memory each replica of the resource is entitled to: the device's memory over "
            "its replicas, or the MPS client limit.",
            labels=["resource", "gpu", "mig"],
        )
        exceeded = GaugeMetricFamily(
            f"{_PREFIX}_gpu_share_exceeded_pods",
            "Pods over their memory share of the GPU for longer than usage.overShareSeconds.",
            labels=["gpu"],
        )
        if view is not None:
            _pods(view.report.containers(), used, share, utilization)
            for gpu in view.report.gpus:
                gpu_used.add_metric([gpu.uuid], gpu.memory_used)
                gpu_total.add_metric([gpu.uuid], gpu.memory_total)
                over = sum(1 for p in view.exceeded if p.gpu == gpu.uuid)
                if any(d.shared for d in gpu.devices):
                    exceeded.add_metric([gpu.uuid], over)
            shares: dict[tuple[str, str, str], int] = {}
            for device in view.report.devices():
                for s in device.shares:
                    key = (s.resource, str(device.gpu), device.mig)
                    shares[key] = min(shares.get(key, s.share), s.share)
            for key, value in sorted(shares.items()):
                replica.add_metric(list(key), value)
        yield from (used, share, utilization, gpu_used, gpu_total, replica, exceeded)


def _family(name: str, text: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{_PREFIX}_{name}", text, labels=list(POD_LABELS))


def _pods(
    containers: Sequence[ContainerUsage],
    used: GaugeMetricFamily,
    share: GaugeMetricFamily,
    utilization: GaugeMetricFamily,
) -> None:
    memory: dict[tuple[str, ...], int] = {}
    shares: dict[tuple[str, ...], int] = {}
    busy: dict[tuple[str, ...], float] = {}
    for c in containers:
        h = c.holder
        key: tuple[str, ...] = (h.namespace, h.pod, h.container, c.resource, c.gpu, c.mig)
        memory[key] = memory.get(key, 0) + c.memory
        if c.attributed:
            shares[key] = shares.get(key, 0) + c.share
        if c.sm is not None:
            busy[key] = min(busy.get(key, 0.0) + c.sm, 1.0)
    for key, value in memory.items():
        used.add_metric(list(key), value)
    for key, value in shares.items():
        share.add_metric(list(key), value)
    for key, ratio in busy.items():
        utilization.add_metric(list(key), ratio)


def usage_document(view: UsageView) -> dict[str, Any]:
    """The `usage` key of `/status`: per GPU, its devices, who holds and uses each."""
    over = {(p.namespace, p.pod, p.device) for p in view.exceeded}
    return {
        "at": view.at,
        "utilization": view.report.utilization,
        "problems": list(view.report.problems),
        "gpus": [
            {
                "uuid": gpu.uuid,
                "index": gpu.index,
                "product": gpu.product,
                "memoryTotal": gpu.memory_total,
                "memoryUsed": gpu.memory_used,
                "devices": [
                    {
                        "uuid": d.uuid,
                        "index": d.index,
                        "mig": d.mig,
                        "memoryTotal": d.memory_total,
                        "memoryUsed": d.memory_used,
                        "shares": [
                            {"resource": s.resource, "replicas": s.replicas, "share": s.share}
                            for s in d.shares
                        ],
                        "containers": [
                            {
                                "namespace": c.holder.namespace,
                                "pod": c.holder.pod,
                                "container": c.holder.container,
                                "resource": c.resource,
                                "replicas": list(c.replicas),
                                "memoryUsed": c.memory,
                                "share": c.share,
                                "utilization": c.sm,
                                "pids": list(c.pids),
                                "overShare": (c.holder.namespace, c.holder.pod, d.uuid) in over,
                            }
                            for c in d.containers
                        ],
                    }
                    for d in gpu.devices
                ],
            }
            for gpu in view.report.gpus
        ],
    }
