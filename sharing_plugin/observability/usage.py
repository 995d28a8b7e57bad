"""Per-pod GPU usage as Prometheus series and as the `usage` part of `/status`.

The series are written at scrape time from the latest `UsageSnapshot` (made for that scrape, or
shared with another within a second), never kept in gauges: a pod that left has no row in the
report, so its series are simply not there at the next scrape. Rows that share a label set
(two MIG devices of one profile on a GPU, held by one container; the unattributed processes of
a device) are summed.

They are written here in the Prometheus text format rather than handed to prometheus-client as
metric families: its exposition formats every sample's labels on its own (about 10 us a
sample here), which for the three series of each of 384 containers was half of one scrape's
20 ms budget. Each row's label string is escaped once and shared by its three series.

Series (bytes, ratios 0..1; `mig` is the MIG profile, empty for a whole GPU):
`sharing_plugin_pod_gpu_memory_used_bytes`, `sharing_plugin_pod_gpu_memory_share_bytes`,
`sharing_plugin_pod_gpu_memory_cap_bytes` (only where the driver caps it) and
`sharing_plugin_pod_gpu_utilization_ratio` {namespace, pod, container, resource, gpu, mig};
`sharing_plugin_gpu_memory_used_bytes` and `sharing_plugin_gpu_memory_total_bytes` {gpu};
`sharing_plugin_replica_memory_share_bytes` {resource, gpu, mig};
`sharing_plugin_gpu_share_exceeded_pods` {gpu}.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sharing_plugin.usage.model import ContainerUsage, UsageSnapshot
from sharing_plugin.usage.overshare import PodOnDevice

_PREFIX = "sharing_plugin"
POD_LABELS = ("namespace", "pod", "container", "resource", "gpu", "mig")

FAMILIES = {
    "pod_gpu_memory_used_bytes": "GPU memory the pod's processes use.",
    "pod_gpu_memory_share_bytes": (
        "GPU memory the replicas the container holds entitle it to (0: holds none there)."
    ),
    "pod_gpu_memory_cap_bytes": (
        "GPU memory the driver caps the container at there (memoryLimits); no series: no cap."
    ),
    "pod_gpu_utilization_ratio": (
        "SM utilization of the container's processes over NVML's last second (0..1)."
    ),
    "gpu_memory_used_bytes": "GPU memory in use (NVML).",
    "gpu_memory_total_bytes": "GPU memory (NVML).",
    "replica_memory_share_bytes": (
        "GPU memory each replica of the resource is entitled to: the device's memory over its "
        "replicas, or the MPS client limit."
    ),
    "gpu_share_exceeded_pods": (
        "Pods over their memory share of the GPU for longer than usage.overShareSeconds."
    ),
}


@dataclass(frozen=True, slots=True)
class UsageView:
    """What the series and `/status` show: the report and the pods over their share."""

    report: UsageSnapshot
    exceeded: tuple[PodOnDevice, ...] = ()
    at: str = ""  # RFC 3339, when the report was read


class UsageExposition:
    """The usage series of `view()` as text (None: nothing read yet, families without series)."""

    def __init__(self, view: Callable[[], UsageView | None]) -> None:
        self._view = view

    def text(self) -> bytes:
        view = self._view()
        lines: dict[str, list[str]] = {name: [] for name in FAMILIES}
        if view is not None:
            _pods(view.report.containers(), lines)
            for gpu in view.report.gpus:
                labels = _labels(("gpu",), (gpu.uuid,))
                lines["gpu_memory_used_bytes"].append(f"{labels} {gpu.memory_used}")
                lines["gpu_memory_total_bytes"].append(f"{labels} {gpu.memory_total}")
                if any(d.shared for d in gpu.devices):
                    over = sum(1 for p in view.exceeded if p.gpu == gpu.uuid)
                    lines["gpu_share_exceeded_pods"].append(f"{labels} {over}")
            shares: dict[tuple[str, str, str], int] = {}
            for device in view.report.devices():
                for s in device.shares:
                    key = (s.resource, str(device.gpu), device.mig)
                    shares[key] = min(shares.get(key, s.share), s.share)
            for key, value in sorted(shares.items()):
                labels = _labels(("resource", "gpu", "mig"), key)
                lines["replica_memory_share_bytes"].append(f"{labels} {value}")
        out = []
        for name, text in FAMILIES.items():
            full = f"{_PREFIX}_{name}"
            out.append(f"# HELP {full} {text}\n# TYPE {full} gauge\n")
            out.extend(f"{full}{line}\n" for line in lines[name])
        return "".join(out).encode()


def _pods(containers: Sequence[ContainerUsage], lines: dict[str, list[str]]) -> None:
    memory: dict[tuple[str, ...], int] = {}
    shares: dict[tuple[str, ...], int] = {}
    caps: dict[tuple[str, ...], int] = {}
    busy: dict[tuple[str, ...], float] = {}
    for c in containers:
        h = c.holder
        key: tuple[str, ...] = (h.namespace, h.pod, h.container, c.resource, c.gpu, c.mig)
        memory[key] = memory.get(key, 0) + c.memory
        if c.attributed:
            shares[key] = shares.get(key, 0) + c.share
        if c.cap is not None:
            caps[key] = caps.get(key, 0) + c.cap
        if c.sm is not None:
            busy[key] = min(busy.get(key, 0.0) + c.sm, 1.0)
    for key, value in memory.items():
        labels = _labels(POD_LABELS, key)
        lines["pod_gpu_memory_used_bytes"].append(f"{labels} {value}")
        if key in shares:
            lines["pod_gpu_memory_share_bytes"].append(f"{labels} {shares[key]}")
        if key in caps:
            lines["pod_gpu_memory_cap_bytes"].append(f"{labels} {caps[key]}")
        if key in busy:
            lines["pod_gpu_utilization_ratio"].append(f"{labels} {busy[key]!r}")


def _labels(names: Sequence[str], values: Sequence[str]) -> str:
    return "{" + ",".join(f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True)) + "}"


def _escape(value: str) -> str:
    """A label value as the text format writes it: backslash, double quote and newline escaped."""
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


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
                                "cap": c.cap,
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
