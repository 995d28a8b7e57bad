"""The caps a usage reading shows, and the cgroups the late mend checks: each capped container's
processes, at the largest of its caps (what the hook would have set), per GPU it uses."""

from __future__ import annotations

from dataclasses import replace

from plan_factory import config, gpu, node

from sharing_plugin.gpus.holders import HeldReplica, Holder
from sharing_plugin.gpus.inventory import GpuUuid
from sharing_plugin.plan import plan
from sharing_plugin.plan.caps import NodeFacts
from sharing_plugin.plan.model import replica_id
from sharing_plugin.usage.caps import CgroupCap, cgroup_caps
from sharing_plugin.usage.cgroup import parse_cgroup
from sharing_plugin.usage.model import (
    CgroupRef,
    DeviceMemory,
    GpuProcess,
    NvmlUsage,
    PodIdentity,
    UsageSnapshot,
)
from sharing_plugin.usage.report import build_report

MIB = 1 << 20
GPU = "nvidia.com/gpu"
A = Holder("ml", "train-a", "main")
B = Holder("ml", "train-b", "main")
UID_A, UID_B = "aaaaaaaa-0000-4000-8000-000000000001", "bbbbbbbb-0000-4000-8000-000000000001"
PODS = {
    UID_A: PodIdentity("ml", "train-a", UID_A, {"a" * 64: "main"}),
    UID_B: PodIdentity("ml", "train-b", UID_B, {"b" * 64: "main"}),
}
INVENTORY = replace(node(gpu(0), gpu(1)), driver_version="615.25.01")
G0, G1 = (g.uuid for g in INVENTORY.gpus)
SCOPE_A = (
    "/kubepods.slice/kubepods-podaaaaaaaa_0000_4000_8000_000000000001.slice/cri-containerd-"
    + "a" * 64
    + ".scope"
)
SCOPE_B = SCOPE_A.replace("a", "b")


def reading(
    enforce: str,
    held: list[HeldReplica],
    processes: list[GpuProcess],
    cgroups: dict[int, CgroupRef | None] | None = None,
) -> UsageSnapshot:
    cfg = config(
        memoryLimits={"enforce": enforce},
        sharing={"timeSlicing": {"resources": [{"name": GPU, "replicas": 4}]}},
    )
    facts = NodeFacts(cgroup_version=2, hook_problem=None)
    return build_report(
        plan=plan(cfg, INVENTORY, facts=facts),
        inventory=INVENTORY,
        nvml=NvmlUsage(
            processes=tuple(processes),
            memory=tuple(DeviceMemory(g, 80 << 30, 0) for g in (G0, G1)),
        ),
        held=held,
        cgroups=cgroups or {},
        pods=PODS,
    )


def proc(pid: int, gpu_uuid: GpuUuid) -> GpuProcess:
    return GpuProcess(pid=pid, device=gpu_uuid, gpu=gpu_uuid, memory=MIB, sm=None)


def holding(holder: Holder, gpu_uuid: str, *replicas: int) -> list[HeldReplica]:
    return [HeldReplica(replica_id(gpu_uuid, r), GPU, holder) for r in replicas]


def test_a_reading_shows_each_containers_cap_beside_its_share() -> None:
    r = reading("best-effort", holding(A, G0, 0, 1), [proc(10, G0)])
    (row,) = r.containers()
    assert row.share == row.cap == 2 * (81_920 // 4) * MIB
    off = reading("off", holding(A, G0, 0, 1), [proc(10, G0)])
    assert [c.cap for c in off.containers()] == [None]


def test_the_mend_names_each_process_cgroup_at_the_largest_cap() -> None:
    held = [*holding(A, G0, 0, 1), *holding(A, G1, 0), *holding(B, G1, 1)]
    cgroups: dict[int, CgroupRef | None] = {
        10: CgroupRef(UID_A, "a" * 64, SCOPE_A),
        11: CgroupRef(UID_A, "a" * 64, SCOPE_A),
        20: CgroupRef(UID_B, "b" * 64, SCOPE_B),
        30: None,  # a host process: no pod, no cap
    }
    processes = [proc(10, G0), proc(11, G1), proc(20, G1), proc(30, G1)]
    r = reading("required", held, processes, cgroups)
    caps = sorted(cgroup_caps(r, cgroups), key=lambda c: (c.cgroup, c.gpu))
    two = 2 * (81_920 // 4)
    assert caps == [
        CgroupCap(G0, SCOPE_A, two, A),
        CgroupCap(G1, SCOPE_A, two, A),  # one replica on GPU 1, but one value for all
        CgroupCap(G1, SCOPE_B, 81_920 // 4, B),
    ]


def test_a_process_without_a_v2_path_cannot_be_named() -> None:
    r = reading("best-effort", holding(A, G0, 0), [proc(10, G0)])
    assert cgroup_caps(r, {10: CgroupRef("a", "a" * 64, "")}) == []


def test_the_v2_path_is_read_from_the_unified_line() -> None:
    text = f"12:memory:/kubepods/poda/x\n0::{SCOPE_A}\n"
    ref = parse_cgroup(text)
    assert ref is not None and ref.path == SCOPE_A
    v1 = parse_cgroup("4:memory:/kubepods/burstable/pod" + "0" * 32 + "/" + "c" * 64 + "\n")
    assert v1 is not None and v1.path == ""
