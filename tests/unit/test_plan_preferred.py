"""preferred(): distributed / packed replicas, link-aware whole GPUs, never out of bounds."""

from __future__ import annotations

import time

from plan_factory import config, gpu, gpu_uuid, node, nvlinked, time_slicing

from sharing_plugin.config.model import AllocationPolicy
from sharing_plugin.gpus.inventory import GpuLink, Inventory, Topology
from sharing_plugin.plan import plan, preferred
from sharing_plugin.plan.model import physical_of

D, P = AllocationPolicy.DISTRIBUTED, AllocationPolicy.PACKED
INV = node(gpu(0), gpu(1), gpu(2))
SHARED = plan(time_slicing({"name": "gpu", "replicas": 4}), INV).resources[0]


def gpus_of(ids: list[str]) -> list[str]:
    return [physical_of(i) for i in ids]


def test_distributed_spreads_two_replicas_over_two_gpus() -> None:
    available = [d.id for d in SHARED.devices if d.gpu_uuid != gpu_uuid(2)]
    got = preferred(SHARED, available, [], 2, D)
    assert sorted(gpus_of(got)) == [gpu_uuid(0), gpu_uuid(1)]


def test_distributed_prefers_the_least_used_gpu() -> None:
    # GPU 0 has 3 of 4 replicas in use, GPU 1 one, GPU 2 none.
    taken = {f"{gpu_uuid(0)}::{n}" for n in range(3)} | {f"{gpu_uuid(1)}::0"}
    available = [i for i in SHARED.ids if i not in taken]
    got = preferred(SHARED, available, [], 3, D)
    assert gpus_of(got) == [gpu_uuid(2), gpu_uuid(1), gpu_uuid(2)]


def test_packed_fills_one_gpu_first() -> None:
    taken = {f"{gpu_uuid(1)}::0"}
    available = [i for i in SHARED.ids if i not in taken]
    got = preferred(SHARED, available, [], 3, P)
    assert gpus_of(got) == [gpu_uuid(1)] * 3
    assert got == [f"{gpu_uuid(1)}::{n}" for n in (1, 2, 3)]


def test_must_include_comes_first_and_counts() -> None:
    must = [f"{gpu_uuid(0)}::2"]
    got = preferred(SHARED, list(SHARED.ids), must, 3, D)
    assert got[0] == must[0]
    assert sorted(gpus_of(got)) == [gpu_uuid(0), gpu_uuid(1), gpu_uuid(2)]


def test_short_supply_returns_what_it_can_and_never_raises() -> None:
    available = [f"{gpu_uuid(0)}::0", f"{gpu_uuid(1)}::0"]
    assert sorted(preferred(SHARED, available, [], 5, D)) == sorted(available)
    assert preferred(SHARED, [], [], 2, D) == []
    assert preferred(SHARED, ["bogus"], ["not-offered"], 2, D) == ["bogus"]


def _dgx_like() -> Inventory:
    """16 GPUs: NVLink only within each quad {0-3}, {4-7}, ...; NUMA 0 for 0-7, 1 for 8-15."""
    gpus = [gpu(i, numa=i // 8) for i in range(16)]
    links = []
    for a in range(16):
        for b in range(a + 1, 16):
            if a // 4 == b // 4:
                links.append(GpuLink(a, b, 4, Topology.NODE))
            else:
                topology = Topology.NODE if a // 8 == b // 8 else Topology.SYSTEM
                links.append(GpuLink(a, b, 0, topology))
    return Inventory(gpus=tuple(gpus), links=tuple(links))


def test_whole_gpus_pick_an_nvlink_quad_with_must_include() -> None:
    inv = _dgx_like()
    res = plan(config(), inv).resources[0]
    got = preferred(res, list(res.ids), [gpu_uuid(9)], 4, D, inventory=inv)
    assert sorted(got) == sorted(gpu_uuid(i) for i in (8, 9, 10, 11))
    # GPU 5 taken: the best 4 are another whole quad, not a broken one.
    available = [i for i in res.ids if i != gpu_uuid(5)]
    got = preferred(res, available, [], 4, D, inventory=inv)
    assert {int(physical_of(i)[4:12], 16) // 4 for i in got} in ({0}, {2}, {3})


def test_whole_gpus_eight_of_sixteen_prefer_one_numa_node() -> None:
    inv = _dgx_like()
    res = plan(config(), inv).resources[0]
    available = [i for i in res.ids if i not in (gpu_uuid(1), gpu_uuid(13))]
    got = preferred(res, available, [], 6, D, inventory=inv)
    numa = {res.device(i).numa for i in got}  # type: ignore[union-attr]
    assert len(numa) == 1 and set(got) <= set(available)


def test_whole_gpus_fast_enough() -> None:
    inv = _dgx_like()
    res = plan(config(), inv).resources[0]
    ids = list(res.ids)
    preferred(res, ids, [], 8, D, inventory=inv)
    start = time.perf_counter()
    for _ in range(20):
        preferred(res, ids, [ids[3]], 8, D, inventory=inv)
    per_call = (time.perf_counter() - start) / 20
    assert per_call < 0.01  # generous for slow CI; bench/ records the real figure


def test_without_links_numa_decides() -> None:
    inv = node(gpu(0, numa=0), gpu(1, numa=1), gpu(2, numa=0), gpu(3, numa=1))
    res = plan(config(), inv).resources[0]
    got = preferred(res, list(res.ids), [gpu_uuid(1)], 2, D)
    assert got == [gpu_uuid(1), gpu_uuid(3)]
    linked = nvlinked(gpu(0), gpu(1))
    res2 = plan(config(), linked).resources[0]
    assert len(preferred(res2, list(res2.ids), [], 2, D, inventory=linked)) == 2
