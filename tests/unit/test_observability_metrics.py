"""Metrics: names, labels and values as Prometheus will scrape them."""

from __future__ import annotations

import sys

from prometheus_client.parser import text_string_to_metric_families

from sharing_plugin import installed_version
from sharing_plugin.observability import Metrics

GPU = "nvidia.com/gpu"


def samples(metrics: Metrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of one scrape, keyed by (name, labels), parsed by prometheus' own parser."""
    text = metrics.render().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return samples(metrics).get((name, frozenset(labels.items())))


def test_devices_per_resource_and_forgetting_a_removed_resource() -> None:
    m = Metrics()
    m.set_devices(GPU, total=8, healthy=7, draining=1)
    m.set_devices("nvidia.com/gpu.shared", total=40, healthy=40)
    m.set_registered(GPU, True)
    assert value(m, "sharing_plugin_devices", resource=GPU) == 8
    assert value(m, "sharing_plugin_healthy_devices", resource=GPU) == 7
    assert value(m, "sharing_plugin_draining_devices", resource=GPU) == 1
    assert value(m, "sharing_plugin_resource_registered", resource=GPU) == 1
    m.observe_allocate(GPU, 0.001)

    m.forget_resource(GPU)
    m.forget_resource("never-seen")  # no error
    assert value(m, "sharing_plugin_devices", resource=GPU) is None
    assert value(m, "sharing_plugin_healthy_devices", resource=GPU) is None
    assert value(m, "sharing_plugin_devices", resource="nvidia.com/gpu.shared") == 40
    # counters survive: rate() must never see them go back to zero
    assert value(m, "sharing_plugin_allocations_total", resource=GPU, result="ok") == 1


def test_allocate_counter_and_latency_histogram() -> None:
    m = Metrics()
    m.observe_allocate(GPU, 0.0002)
    m.observe_allocate(GPU, 0.03)
    m.observe_allocate(GPU, 0.0004, ok=False)
    assert value(m, "sharing_plugin_allocations_total", resource=GPU, result="ok") == 2
    assert value(m, "sharing_plugin_allocations_total", resource=GPU, result="failed") == 1
    hist = "sharing_plugin_allocate_duration_seconds"
    assert value(m, f"{hist}_count", resource=GPU) == 3
    assert value(m, f"{hist}_bucket", resource=GPU, le="0.00025") == 1
    assert value(m, f"{hist}_bucket", resource=GPU, le="0.0005") == 2
    assert value(m, f"{hist}_bucket", resource=GPU, le="0.05") == 3
    assert value(m, f"{hist}_bucket", resource=GPU, le="0.1") == 3


def test_reloads_ok_and_failed() -> None:
    m = Metrics(clock=lambda: 1_700_000_000.0)
    m.count_reload(True)
    m.count_reload(False)
    m.count_reload(False)
    assert value(m, "sharing_plugin_reloads_total", result="ok") == 1
    assert value(m, "sharing_plugin_reloads_total", result="failed") == 2
    assert value(m, "sharing_plugin_config_last_reload_successful") == 0
    assert value(m, "sharing_plugin_config_last_reload_success_timestamp_seconds") == 1.7e9


def test_registrations_health_events_and_mig_operations() -> None:
    m = Metrics(version="1.2.3")
    m.count_registration(GPU)
    m.count_registration(GPU, ok=False)
    m.count_health_event("GPU-aaaa", 79)
    m.count_health_event("GPU-aaaa", 79)
    m.set_gpu_healthy("GPU-aaaa", False)
    m.count_mig_operation("create-gpu-instance")
    m.count_mig_operation("destroy-gpu-instance", ok=False)
    assert value(m, "sharing_plugin_registrations_total", resource=GPU, result="ok") == 1
    assert value(m, "sharing_plugin_registrations_total", resource=GPU, result="failed") == 1
    assert value(m, "sharing_plugin_gpu_health_events_total", gpu="GPU-aaaa", xid="79") == 2
    assert value(m, "sharing_plugin_gpu_healthy", gpu="GPU-aaaa") == 0
    assert (
        value(
            m, "sharing_plugin_mig_operations_total", operation="create-gpu-instance", result="ok"
        )
        == 1
    )
    assert value(m, "sharing_plugin_build_info", version="1.2.3") == 1


def test_each_instance_has_its_own_registry() -> None:
    # Two daemons in one process (tests, demo) must not clash on metric names.
    a, b = Metrics(), Metrics()
    a.set_devices(GPU, total=1, healthy=1)
    b.set_devices(GPU, total=2, healthy=2)
    assert value(a, "sharing_plugin_devices", resource=GPU) == 1
    assert value(b, "sharing_plugin_devices", resource=GPU) == 2


def test_build_info_defaults_to_the_installed_version() -> None:
    assert value(Metrics(), "sharing_plugin_build_info", version=installed_version()) == 1
    assert value(Metrics(version="1.2.3"), "sharing_plugin_build_info", version="1.2.3") == 1


def test_config_info_is_one_series_replaced_on_each_applied_config() -> None:
    m = Metrics()
    m.set_config(name=None, hash_="abc", generation=1)
    info = {k: v for k, v in samples(m).items() if k[0] == "sharing_plugin_config_info"}
    assert info == {
        (
            "sharing_plugin_config_info",
            frozenset({("name", ""), ("hash", "abc"), ("generation", "1")}),
        ): 1
    }
    m.set_config(name="small", hash_="def", generation=2)
    info = {k: v for k, v in samples(m).items() if k[0] == "sharing_plugin_config_info"}
    assert info == {
        (
            "sharing_plugin_config_info",
            frozenset({("name", "small"), ("hash", "def"), ("generation", "2")}),
        ): 1
    }


def test_no_created_series_and_process_and_python_collectors() -> None:
    m = Metrics()
    m.observe_allocate(GPU, 0.001)
    m.count_reload(True)
    names = {name for name, _ in samples(m)}
    assert not [n for n in names if n.endswith("_created")]
    assert "python_info" in names
    assert any(n.startswith("python_gc_") for n in names)
    if sys.platform == "linux":
        assert "process_resident_memory_bytes" in names
        assert "process_start_time_seconds" in names


def test_usage_per_resource_and_replicas_in_use_per_gpu() -> None:
    m = Metrics()
    m.set_usage(GPU, allocated=3, available=5)
    assert value(m, "sharing_plugin_devices_allocated", resource=GPU) == 3
    assert value(m, "sharing_plugin_devices_available", resource=GPU) == 5
    m.set_replicas_in_use({"GPU-a": 2, "GPU-b": 0})
    assert value(m, "sharing_plugin_gpu_replicas_in_use", gpu="GPU-a") == 2
    m.set_replicas_in_use({"GPU-b": 1})
    assert value(m, "sharing_plugin_gpu_replicas_in_use", gpu="GPU-a") is None
    assert value(m, "sharing_plugin_gpu_replicas_in_use", gpu="GPU-b") == 1
    m.forget_resource(GPU)
    assert value(m, "sharing_plugin_devices_allocated", resource=GPU) is None
    assert value(m, "sharing_plugin_devices_available", resource=GPU) is None
