"""Which cgroups should carry a memory cap, from one usage reading: what the late mend checks.

The toolkit's hook caps a container as it starts; where it never ran (a runtime without CDI, an
older toolkit) nothing does, and the container could take the whole GPU. So each reading lists,
for every container holding capped replicas whose processes it sees, the cgroup of each of
those processes and the cap the hook would have set: the largest of the container's caps on
its GPUs (the hook takes one value for all of them, as Allocate answered), on each GPU it uses.
MIG devices carry no cap (their memory is isolated); processes whose cgroup path is unknown
(cgroup v1, an unreadable /proc entry) cannot be named to NVML and are left out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sharing_plugin.gpus.holders import Holder
from sharing_plugin.gpus.inventory import GpuUuid
from sharing_plugin.usage.model import CgroupRef, UsageSnapshot

MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class CgroupCap:
    """One cgroup's cap on one GPU, and the container it is for."""

    gpu: GpuUuid
    cgroup: str
    mib: int
    holder: Holder


def cgroup_caps(report: UsageSnapshot, cgroups: Mapping[int, CgroupRef | None]) -> list[CgroupCap]:
    """Every (GPU, cgroup) a capped container's processes run in, with its cap (module doc)."""
    largest: dict[Holder, int] = {}
    for c in report.containers():
        if c.cap is not None and c.attributed:
            largest[c.holder] = max(largest.get(c.holder, 0), c.cap)
    found: dict[tuple[GpuUuid, str], CgroupCap] = {}
    for c in report.containers():
        cap = largest.get(c.holder)
        if cap is None or c.mig:
            continue
        for pid in c.pids:
            ref = cgroups.get(pid)
            if ref is not None and ref.path:
                found[(c.gpu, ref.path)] = CgroupCap(c.gpu, ref.path, cap // MIB, c.holder)
    return list(found.values())
