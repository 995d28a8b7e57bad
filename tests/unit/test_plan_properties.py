"""Properties of plan(), allocate() and preferred() over generated nodes and configs."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from plan_factory import config, gpu, node

from sharing_plugin.config.model import AllocationPolicy, Config
from sharing_plugin.errors import AllocationError
from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.plan import allocate, plan, preferred
from sharing_plugin.plan.model import physical_of

PROFILES = ("1g.10gb", "2g.20gb", "3g.40gb")


@st.composite
def nodes(draw: st.DrawFn) -> Inventory:
    count = draw(st.integers(0, 6))
    gpus = []
    for i in range(count):
        migs = draw(st.lists(st.sampled_from(PROFILES), max_size=3))
        gpus.append(gpu(i, migs=tuple(migs), numa=draw(st.sampled_from([0, 1, None]))))
    return node(*gpus)


@st.composite
def shared_configs(draw: st.DrawFn, inventory: Inventory) -> tuple[Config, dict[int, int]]:
    """A time-slicing config giving per-GPU replicas to a random subset of GPU indexes."""
    strategy = draw(st.sampled_from(["none", "mixed"]))
    indexes = [g.index for g in inventory.gpus if strategy == "none" or not g.mig_devices]
    chosen = draw(st.lists(st.sampled_from(indexes), unique=True) if indexes else st.just([]))
    replicas = {i: draw(st.integers(1, 6)) for i in chosen}
    entries: list[dict[str, Any]] = [
        {"name": "gpu", "devices": [i], "replicas": r} for i, r in replicas.items()
    ]
    sections: dict[str, Any] = {"flags": {"migStrategy": strategy}}
    if entries:
        rename = draw(st.booleans())
        sections["sharing"] = {"timeSlicing": {"renameByDefault": rename, "resources": entries}}
    return config(**sections), replicas


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_plan_ids_unique_real_and_counted(data: st.DataObject) -> None:
    inventory = data.draw(nodes())
    cfg, replicas = data.draw(shared_configs(inventory))
    p = plan(cfg, inventory)
    ids = [d.id for r in p.resources for d in r.devices]
    assert len(ids) == len(set(ids))
    for r in p.resources:
        for d in r.devices:
            assert physical_of(d.id) == d.physical
            assert inventory.gpu(d.physical) or inventory.mig_device(d.physical)
            assert inventory.gpu(d.gpu_uuid) is not None
    mixed = cfg.flags.mig_strategy == "mixed"
    expected = 0
    for g in inventory.gpus:
        if mixed and g.mig_enabled:
            expected += len(g.mig_devices)
        else:
            expected += replicas.get(g.index, 1)
    assert len(ids) == expected


@settings(max_examples=40, deadline=None)
@given(nodes(), st.integers(1, 5), st.integers(0, 5))
def test_ids_stable_across_replica_changes(inventory: Inventory, low: int, extra: int) -> None:
    def ids(replicas: int) -> set[str]:
        cfg = config(
            sharing={"timeSlicing": {"resources": [{"name": "gpu", "replicas": replicas}]}}
        )
        return {d.id for r in plan(cfg, inventory).resources for d in r.devices}

    assert ids(low) <= ids(low + extra)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_allocate_grants_only_requested_physical_devices(data: st.DataObject) -> None:
    inventory = data.draw(nodes())
    cfg, _ = data.draw(shared_configs(inventory))
    p = plan(cfg, inventory)
    for r in p.resources:
        request = data.draw(st.lists(st.sampled_from(r.ids), max_size=6))
        strategy = data.draw(st.sampled_from(["uuid", "index"]))
        flags = config(flags={"plugin": {"deviceIDStrategy": strategy}}).flags
        try:
            a = allocate(r, request, flags)
        except AllocationError:  # pragma: no cover - only with failRequestsGreaterThanOne
            continue
        requested = {physical_of(i) for i in request}
        assert set(a.physical) <= requested and len(a.physical) == len(requested)
        told = a.envs["NVIDIA_VISIBLE_DEVICES"].split(",") if request else []
        allowed = requested | {r.device(i).index for i in request}  # type: ignore[union-attr]
        assert set(told) <= allowed


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_preferred_is_a_subset_of_available_with_must_include(data: st.DataObject) -> None:
    inventory = data.draw(nodes())
    cfg, _ = data.draw(shared_configs(inventory))
    p = plan(cfg, inventory)
    for r in p.resources:
        available = data.draw(st.lists(st.sampled_from(r.ids), unique=True))
        must = data.draw(
            st.lists(st.sampled_from(available), unique=True) if available else st.just([])
        )
        size = data.draw(st.integers(0, len(r.ids) + 1))
        policy = data.draw(st.sampled_from(list(AllocationPolicy)))
        got = preferred(r, available, must, size, policy, inventory=inventory)
        assert set(got) <= set(available)
        assert set(must) <= set(got)
        assert len(got) == len(set(got))
        assert len(got) == max(len(must), min(size, len(available)))
