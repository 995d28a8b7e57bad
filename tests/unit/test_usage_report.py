"""Per-pod usage from NVML's processes: attribution, shares, and over-share detection."""

from __future__ import annotations

from plan_factory import gpu, mps, node, time_slicing

from sharing_plugin.gpus.holders import HeldReplica, Holder
from sharing_plugin.gpus.inventory import GpuUuid
from sharing_plugin.plan import plan
from sharing_plugin.plan.model import replica_id
from sharing_plugin.usage.model import (
    CgroupRef,
    DeviceMemory,
    GpuProcess,
    NvmlUsage,
    PodIdentity,
    UsageSnapshot,
)
from sharing_plugin.usage.overshare import OverShareTracker, pods_on_shared_devices
from sharing_plugin.usage.report import build_report

GIB = 1 << 30
MIB = 1 << 20
GPU = "nvidia.com/gpu"
UID_A = "aaaaaaaa-0000-4000-8000-000000000001"
UID_B = "bbbbbbbb-0000-4000-8000-000000000002"
CID_A = "a" * 64
CID_B = "b" * 64
A = Holder("ml", "train-a", "main")
B = Holder("ml", "train-b", "main")

INVENTORY = node(gpu(0), gpu(1))
G0, G1 = (g.uuid for g in INVENTORY.gpus)
PLAN = plan(time_slicing({"name": GPU, "replicas": 4}), INVENTORY)
PODS = {
    UID_A: PodIdentity("ml", "train-a", UID_A, {CID_A: "main"}),
    UID_B: PodIdentity("ml", "train-b", UID_B, {CID_B: "main"}),
}


def held(holder: Holder, gpu_uuid: str, *replicas: int) -> list[HeldReplica]:
    return [HeldReplica(replica_id(gpu_uuid, r), GPU, holder) for r in replicas]


def proc(pid: int, gpu_uuid: GpuUuid, memory: int, sm: float | None = None) -> GpuProcess:
    return GpuProcess(pid=pid, device=gpu_uuid, gpu=gpu_uuid, memory=memory, sm=sm)


def report(
    processes: list[GpuProcess],
    replicas: list[HeldReplica] | None,
    cgroups: dict[int, CgroupRef | None] | None = None,
    pods: dict[str, PodIdentity] | None = None,
    sampled: frozenset[str] = frozenset(),
) -> UsageSnapshot:
    return build_report(
        plan=PLAN,
        inventory=INVENTORY,
        nvml=NvmlUsage(
            processes=tuple(processes),
            memory=tuple(
                DeviceMemory(g, 80 * GIB, sum(p.memory or 0 for p in processes if p.gpu == g))
                for g in (G0, G1)
            ),
            sampled=sampled,
        ),
        held=replicas,
        cgroups=cgroups or {},
        pods=pods,
    )


def rows(r: UsageSnapshot) -> dict[tuple[str, str, str], tuple[int, int, tuple[int, ...]]]:
    """(device, pod, container) -> (memory, share, pids); unattributed as pod '' per pid."""
    return {
        (c.device, c.holder.pod, c.holder.container): (c.memory, c.share, c.pids)
        for c in r.containers()
    }


def test_cgroup_and_api_name_each_process_on_a_shared_gpu() -> None:
    r = report(
        [proc(10, G0, 3 * GIB, 0.25), proc(11, G0, 25 * GIB, 0.5)],
        held(A, G0, 0) + held(B, G0, 1, 2),
        cgroups={10: CgroupRef(UID_A, CID_A), 11: CgroupRef(UID_B, CID_B)},
        pods=PODS,
        sampled=frozenset({G0}),
    )
    share = 20 * GIB  # 80 GiB over 4 replicas
    assert rows(r) == {
        (G0, "train-a", "main"): (3 * GIB, share, (10,)),
        (G0, "train-b", "main"): (25 * GIB, 2 * share, (11,)),
    }
    (gpu0_device,) = r.gpus[0].devices
    assert [(s.resource, s.replicas, s.share) for s in gpu0_device.shares] == [(GPU, 4, share)]
    assert gpu0_device.memory_used == 28 * GIB
    a, b = gpu0_device.containers
    assert (a.resource, a.replicas, a.sm) == (GPU, (replica_id(G0, 0),), 0.25)
    assert b.replicas == (replica_id(G0, 1), replica_id(G0, 2))
    assert r.shared_in_use


def test_holders_without_processes_are_listed_with_zero_memory() -> None:
    r = report([], held(A, G1, 3), sampled=frozenset({G1}))
    ((key, value),) = rows(r).items()
    assert key == (G1, "train-a", "main") and value == (0, 20 * GIB, ())
    (c,) = r.containers()
    assert c.sm == 0.0  # NVML answered for the GPU: holding without running is idle


def test_without_the_api_the_single_holder_of_a_gpu_is_named() -> None:
    r = report([proc(10, G0, GIB), proc(11, G0, GIB)], held(A, G0, 0, 1))
    assert rows(r) == {(G0, "train-a", "main"): (2 * GIB, 40 * GIB, (10, 11))}


def test_without_the_api_two_holders_leave_processes_unattributed_with_their_pid() -> None:
    r = report([proc(11, G0, GIB), proc(10, G0, 2 * GIB)], held(A, G0, 0) + held(B, G0, 1))
    assert rows(r) == {
        (G0, "train-a", "main"): (0, 20 * GIB, ()),
        (G0, "train-b", "main"): (0, 20 * GIB, ()),
        (G0, "", ""): (GIB, 0, (11,)),
    }
    unattributed = [c for c in r.containers() if not c.attributed]
    assert [c.pids for c in unattributed] == [(10,), (11,)]  # one per pid, in pid order


def test_a_host_process_is_never_given_to_the_holder() -> None:
    # its cgroup was read and names no pod: it is not the holder's, whatever PodResources says
    r = report([proc(10, G0, GIB)], held(A, G0, 0), cgroups={10: None})
    assert rows(r)[(G0, "", "")] == (GIB, 0, (10,))
    alone = report([proc(10, G0, GIB)], [], cgroups={10: None})
    assert not alone.shared_in_use  # no pod on it: nothing for over-share checks to follow


def test_a_pod_the_api_does_not_list_falls_back_to_podresources() -> None:
    r = report(
        [proc(10, G0, GIB)],
        held(A, G0, 0),
        cgroups={10: CgroupRef("cccccccc-0000-4000-8000-000000000003", None)},
        pods=PODS,
    )
    assert (G0, "train-a", "main") in rows(r)


def test_a_container_not_yet_in_the_pod_status_is_named_by_its_pod() -> None:
    r = report([proc(10, G0, GIB)], [], cgroups={10: CgroupRef(UID_A, "f" * 64)}, pods=PODS)
    assert rows(r) == {(G0, "train-a", ""): (GIB, 0, (10,))}


def test_unknown_utilization_stays_unknown() -> None:
    r = report([proc(10, G0, GIB)], held(A, G0, 0))
    (c,) = r.containers()
    assert c.sm is None


def test_mig_devices_are_reported_under_their_gpu_with_their_own_memory() -> None:
    inventory = node(gpu(0, migs=("3g.40gb", "1g.10gb")))
    (g,) = inventory.gpus
    big, small = g.mig_devices
    config = time_slicing({"name": "nvidia.com/mig-1g.10gb", "replicas": 2}, **{})
    config = config.model_copy(
        update={"flags": config.flags.model_copy(update={"mig_strategy": "mixed"})}
    )
    shared = plan(config, inventory)
    holder = HeldReplica(replica_id(small.uuid, 0), "nvidia.com/mig-1g.10gb", A)
    r = build_report(
        plan=shared,
        inventory=inventory,
        nvml=NvmlUsage(
            processes=(GpuProcess(pid=5, device=small.uuid, gpu=g.uuid, memory=GIB, sm=None),),
            memory=(DeviceMemory(g.uuid, 80 * GIB, GIB),),
        ),
        held=[holder],
        cgroups={},
        pods=None,
    )
    (gpu_usage,) = r.gpus
    devices = {d.uuid: d for d in gpu_usage.devices}
    assert set(devices) == {big.uuid, small.uuid}
    d = devices[small.uuid]
    assert (d.mig, d.index, d.memory_total, d.memory_used) == ("1g.10gb", "0:1", 10_000 * MIB, GIB)
    (c,) = d.containers
    assert (c.holder, c.mig, c.share) == (A, "1g.10gb", 5_000 * MIB)
    assert d.shared and not devices[big.uuid].shared


def test_an_mps_share_is_the_client_memory_limit() -> None:
    inventory = node(gpu(0))
    shared = plan(mps({"name": GPU, "memoryPerReplica": "10Gi"}), inventory)
    r = build_report(
        plan=shared,
        inventory=inventory,
        nvml=NvmlUsage(processes=(proc(1, G0, GIB),)),
        held=held(A, G0, 0, 1),
        cgroups={},
        pods=None,
    )
    ((_, (memory, share, _)),) = rows(r).items()
    assert (memory, share) == (GIB, 20 * GIB)


def test_an_over_share_pod_is_reported_once_after_the_allowed_time() -> None:
    tracker = OverShareTracker(after_s=60)

    def at(memory: int, now: float) -> list[tuple[str, int, int]]:
        r = report(
            [proc(10, G0, memory), proc(11, G0, GIB)],
            held(A, G0, 0) + held(B, G0, 1),
            cgroups={10: CgroupRef(UID_A, CID_A), 11: CgroupRef(UID_B, CID_B)},
            pods=PODS,
        )
        return [
            (e.usage.pod, e.usage.memory, e.usage.share)
            for e in tracker.observe(pods_on_shared_devices(r), now)
        ]

    assert at(30 * GIB, 0) == []  # over its 20 GiB share, not for long yet
    assert tracker.next_deadline() == 60
    assert at(30 * GIB, 59.9) == []
    assert at(31 * GIB, 60) == [("train-a", 31 * GIB, 20 * GIB)]
    assert [u.pod for u in tracker.exceeded()] == ["train-a"]
    assert tracker.next_deadline() is None
    assert at(31 * GIB, 600) == []  # once per episode
    assert at(10 * GIB, 601) == [] and tracker.exceeded() == []  # back within its share
    assert at(30 * GIB, 602) == []  # a new episode starts the clock again
    assert at(30 * GIB, 662) == [("train-a", 30 * GIB, 20 * GIB)]


def test_a_pod_within_its_share_or_on_a_whole_gpu_is_never_over() -> None:
    tracker = OverShareTracker(after_s=0)
    whole = plan(time_slicing({"name": GPU, "replicas": 1}), INVENTORY)
    r = build_report(
        plan=whole,
        inventory=INVENTORY,
        nvml=NvmlUsage(processes=(proc(10, G0, 70 * GIB),)),
        held=[HeldReplica(G0, GPU, A)],
        cgroups={},
        pods=None,
    )
    assert pods_on_shared_devices(r) == []
    within = report([proc(10, G0, 20 * GIB)], held(A, G0, 0))
    assert tracker.observe(pods_on_shared_devices(within), 0) == []


def test_a_pod_using_a_shared_gpu_it_holds_nothing_of_has_no_share() -> None:
    r = report(
        [proc(10, G1, GIB)], held(A, G0, 0), cgroups={10: CgroupRef(UID_B, CID_B)}, pods=PODS
    )
    (on_g1,) = [u for u in pods_on_shared_devices(r) if u.device == G1]
    assert (on_g1.pod, on_g1.share, on_g1.over) == ("train-b", 0, True)
    assert OverShareTracker(after_s=0).observe([on_g1], 5)[0].since == 5
