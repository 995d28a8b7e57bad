"""The usage series a scrape yields and the `usage` part of /status, from a report value."""

from __future__ import annotations

from plan_factory import gpu, node, time_slicing
from prometheus_client.parser import text_string_to_metric_families

from sharing_plugin.gpus.holders import HeldReplica, Holder
from sharing_plugin.observability.usage import UsageExposition, UsageView, usage_document
from sharing_plugin.plan import plan
from sharing_plugin.plan.model import replica_id
from sharing_plugin.usage.model import (
    DeviceMemory,
    GpuProcess,
    NvmlUsage,
    UsageSnapshot,
)
from sharing_plugin.usage.overshare import OverShareTracker, pods_on_shared_devices
from sharing_plugin.usage.report import build_report

GIB = 1 << 30
GPU = "nvidia.com/gpu"
INVENTORY = node(gpu(0), gpu(1))
G0, G1 = (g.uuid for g in INVENTORY.gpus)
A = Holder("ml", "a", "main")


def report(*processes: GpuProcess) -> UsageSnapshot:
    return build_report(
        plan=plan(time_slicing({"name": GPU, "replicas": 2}), INVENTORY),
        inventory=INVENTORY,
        nvml=NvmlUsage(
            processes=processes,
            memory=(DeviceMemory(G0, 80 * GIB, 7 * GIB), DeviceMemory(G1, 80 * GIB, 0)),
            sampled=frozenset({G0}),
        ),
        held=[HeldReplica(replica_id(G0, 0), GPU, A)],
        cgroups={},
        pods=None,
    )


def series(view: UsageView | None) -> dict[str, dict[frozenset[tuple[str, str]], float]]:
    """The text, read by prometheus-client's own parser (a format slip fails here)."""
    text = UsageExposition(lambda: view).text().decode()
    out: dict[str, dict[frozenset[tuple[str, str]], float]] = {}
    for family in text_string_to_metric_families(text):
        assert family.type == "gauge" and family.documentation
        out.setdefault(family.name, {})
        for s in family.samples:
            out[family.name][frozenset(s.labels.items())] = s.value
    return out


def labels(**kw: str) -> frozenset[tuple[str, str]]:
    base = {"namespace": "", "pod": "", "container": "", "resource": "", "gpu": G0, "mig": ""}
    return frozenset({**base, **kw}.items())


def test_the_series_of_one_reading() -> None:
    r = report(
        GpuProcess(pid=1, device=G0, gpu=G0, memory=4 * GIB, sm=0.5),
        GpuProcess(pid=2, device=G0, gpu=G0, memory=2 * GIB, sm=0.25),
        GpuProcess(pid=3, device=G0, gpu=G0, memory=GIB, sm=0.0),  # second of them all
    )
    # pod a holds GPU 0 alone: all three processes are its own (PodResources' single holder)
    tracker = OverShareTracker(after_s=0)
    tracker.observe(pods_on_shared_devices(r), 0)
    out = series(UsageView(report=r, exceeded=tuple(tracker.exceeded())))
    a = labels(namespace="ml", pod="a", container="main", resource=GPU)
    assert out["sharing_plugin_pod_gpu_memory_used_bytes"] == {a: 7 * GIB}
    assert out["sharing_plugin_pod_gpu_memory_share_bytes"] == {a: 40 * GIB}
    assert out["sharing_plugin_pod_gpu_utilization_ratio"] == {a: 0.75}
    assert out["sharing_plugin_gpu_memory_used_bytes"] == {
        frozenset({("gpu", G0)}): 7 * GIB,
        frozenset({("gpu", G1)}): 0,
    }
    assert (
        out["sharing_plugin_replica_memory_share_bytes"][
            frozenset({("resource", GPU), ("gpu", G1), ("mig", "")})
        ]
        == 40 * GIB
    )
    assert out["sharing_plugin_gpu_share_exceeded_pods"] == {
        frozenset({("gpu", G0)}): 0,
        frozenset({("gpu", G1)}): 0,
    }


def test_before_any_reading_the_families_are_there_without_series() -> None:
    out = series(None)
    assert out["sharing_plugin_pod_gpu_memory_used_bytes"] == {}
    assert "sharing_plugin_gpu_share_exceeded_pods" in out


def test_status_lists_holders_users_and_pids() -> None:
    r = report(GpuProcess(pid=9, device=G1, gpu=G1, memory=GIB, sm=None))
    document = usage_document(UsageView(report=r, at="2024-01-01T00:00:00.000Z"))
    assert document["at"] == "2024-01-01T00:00:00.000Z"
    g0, g1 = document["gpus"]
    (d0,) = g0["devices"]
    assert d0["shares"] == [{"resource": GPU, "replicas": 2, "share": 40 * GIB}]
    assert d0["containers"] == [
        {
            "namespace": "ml",
            "pod": "a",
            "container": "main",
            "resource": GPU,
            "replicas": [replica_id(G0, 0)],
            "memoryUsed": 0,
            "share": 40 * GIB,
            "cap": None,
            "utilization": 0.0,
            "pids": [],
            "overShare": False,
        }
    ]
    (d1,) = g1["devices"]
    ((unattributed),) = d1["containers"]
    assert (unattributed["pod"], unattributed["pids"], unattributed["utilization"]) == (
        "",
        [9],
        None,
    )


def test_label_values_are_escaped_as_the_text_format_wants() -> None:
    odd = Holder('we"ird', "back\\slash", "new\nline")
    r = build_report(
        plan=plan(time_slicing({"name": GPU, "replicas": 2}), INVENTORY),
        inventory=INVENTORY,
        nvml=NvmlUsage(processes=(GpuProcess(pid=1, device=G0, gpu=G0, memory=5, sm=None),)),
        held=[HeldReplica(replica_id(G0, 0), GPU, odd)],
        cgroups={},
        pods=None,
    )
    used = series(UsageView(report=r))["sharing_plugin_pod_gpu_memory_used_bytes"]
    wanted = labels(namespace='we"ird', pod="back\\slash", container="new\nline", resource=GPU)
    assert used == {wanted: 5}
