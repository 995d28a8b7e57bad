"""The MIG reconciler against the simulated NVML: declared layouts reach the GPUs, incrementally.

Every test goes through the production NVML adapter (discovery and MIG operations) on a
simulated node, and asserts on the simulator's own record of MIG calls.
"""

from __future__ import annotations

from typing import Any

from support.observe import RecordingNvml, reset_gpu, set_lost

from sharing_plugin.config.model import Config
from sharing_plugin.daemon.node.mig import MigReconciler
from sharing_plugin.gpus.holders import Holder
from sharing_plugin.mig.desired import RESET_NEEDED
from sharing_plugin.mig.state import MigState
from sharing_plugin.nvml.discover import discover
from sharing_plugin.observability.metrics import Metrics
from sharing_plugin.plan import plan
from sharing_plugin.sim.nvml.node import load_preset


def _config(*entries: dict[str, Any], **extra: Any) -> Config:
    return Config.model_validate(
        {"flags": {"migStrategy": "mixed"}, "partitioning": {"mig": list(entries)}, **extra}
    )


def _calls(sim: RecordingNvml) -> list[tuple[str, int, str | None, int | None, str]]:
    calls = [(c.op, c.gpu, c.profile, c.start, c.result) for c in sim.mig_calls]
    sim.mig_calls.clear()
    return calls


def _advertised(config: Config, inventory: Any) -> dict[str, int]:
    return {r.name: len(r.devices) for r in plan(config, inventory).resources}


async def test_declared_layout_is_created_and_advertised() -> None:
    sim = RecordingNvml.from_preset("a100-mig-mixed")
    before = discover(sim)
    metrics = Metrics()
    config = _config(
        {"devices": [3], "profiles": {"3g.40gb": 1, "2g.20gb": 2}},
        {"devices": [5], "profiles": {"2g.10gb": 3}},  # MIG off until now
    )
    outcome = await MigReconciler(sim, metrics=metrics).reconcile(config, before, {})

    assert outcome.changed and outcome.problems == ()
    assert outcome.states == {
        before.gpus[3].uuid: (MigState.APPLIED, None),
        before.gpus[5].uuid: (MigState.APPLIED, None),
    }
    gpus = outcome.inventory.gpus
    assert sorted((m.profile, m.placement.start) for m in gpus[3].mig_devices) == [
        ("2g.20gb", 0),
        ("2g.20gb", 2),
        ("3g.40gb", 4),
    ]
    assert gpus[5].mig_enabled and [m.profile for m in gpus[5].mig_devices] == ["2g.10gb"] * 3
    advertised = _advertised(config, outcome.inventory)
    assert advertised["nvidia.com/mig-3g.40gb"] == 2 + 1  # GPUs 0 and 1 had one already
    assert advertised["nvidia.com/mig-2g.10gb"] == 1 + 3
    assert b'operation="create-gpu-instance",result="ok"' in metrics.render()


async def test_changed_layout_touches_only_what_differs() -> None:
    sim = RecordingNvml.from_preset("a100-mig-mixed")  # GPU 0: 3g.40gb@0 2g.20gb@4 1g.10gb@6
    inventory = discover(sim)
    config = _config({"devices": [0], "profiles": {"3g.40gb": 1, "1g.10gb": 3}})
    reconciler = MigReconciler(sim)

    outcome = await reconciler.reconcile(config, inventory, {})
    assert _calls(sim) == [
        ("destroy_compute_instance", 0, "2g.20gb", 4, "SUCCESS"),
        ("destroy_gpu_instance", 0, "2g.20gb", 4, "SUCCESS"),
        ("create_gpu_instance", 0, "1g.10gb", 4, "SUCCESS"),
        ("create_compute_instance", 0, "1g.10gb", 4, "SUCCESS"),
        ("create_gpu_instance", 0, "1g.10gb", 5, "SUCCESS"),
        ("create_compute_instance", 0, "1g.10gb", 5, "SUCCESS"),
    ]
    kept = {m.uuid for m in inventory.gpus[0].mig_devices} - {inventory.gpus[0].mig_devices[1].uuid}
    assert kept <= {m.uuid for m in outcome.inventory.gpus[0].mig_devices}  # same UUIDs kept
    assert outcome.states[inventory.gpus[0].uuid] == (MigState.APPLIED, None)

    again = await reconciler.reconcile(config, outcome.inventory, {})
    assert (again.changed, _calls(sim), again.inventory) == (False, [], outcome.inventory)
    assert again.states[inventory.gpus[0].uuid] == (MigState.APPLIED, None)


async def test_held_instance_waits_for_its_pod_then_goes() -> None:
    sim = RecordingNvml.from_preset("a100-mig-mixed")
    inventory = discover(sim)
    gpu = inventory.gpus[0]
    held_mig = gpu.mig_devices[0]  # 3g.40gb at slices 0-3: in the way of seven 1g.10gb
    config = _config({"devices": [0], "profiles": {"1g.10gb": 7}})
    reconciler = MigReconciler(sim)

    held = {f"{held_mig.uuid}::1": Holder("team-a", "train-0", "main")}
    outcome = await reconciler.reconcile(config, inventory, held)
    state, reason = outcome.states[gpu.uuid]
    assert state is MigState.PENDING and not outcome.changed
    assert reason is not None
    assert reason.startswith(f"waiting for pod team-a/train-0 to release {held_mig.uuid}")
    assert _calls(sim) == [] and outcome.inventory is inventory

    released = await reconciler.reconcile(config, inventory, {})
    assert released.states[gpu.uuid] == (MigState.APPLIED, None)
    calls = _calls(sim)
    assert ("destroy_gpu_instance", 0, "3g.40gb", 0, "SUCCESS") in calls
    assert [m.profile for m in released.inventory.gpus[0].mig_devices] == ["1g.10gb"] * 7


async def test_impossible_layout_is_an_error_and_touches_nothing() -> None:
    sim = RecordingNvml.from_preset("a100-mig-mixed")
    inventory = discover(sim)
    config = _config({"devices": [4], "profiles": {"4g.20gb": 1, "2g.10gb": 2}})
    outcome = await MigReconciler(sim).reconcile(config, inventory, {})
    state, reason = outcome.states[inventory.gpus[4].uuid]
    assert state is MigState.ERROR
    assert "does not allow: 4g.20gb may start only at 0; 2g.10gb may start only at 0, 2 or 4" in (
        reason or ""
    )
    assert [p.path for p in outcome.problems] == ["partitioning.mig[0].profiles"]
    assert (_calls(sim), outcome.changed, outcome.inventory) == ([], False, inventory)


async def test_without_partitioning_mig_is_never_touched() -> None:
    sim = RecordingNvml.from_preset("a100-mig-mixed")
    inventory = discover(sim)
    config = Config.model_validate({"flags": {"migStrategy": "mixed"}})
    outcome = await MigReconciler(sim).reconcile(config, inventory, {})
    assert (outcome.states, outcome.changed, _calls(sim)) == ({}, False, [])
    assert outcome.inventory is inventory


async def test_turning_mig_off_destroys_then_disables() -> None:
    sim = RecordingNvml.from_preset("a100-mig-mixed")
    inventory = discover(sim)
    outcome = await MigReconciler(sim).reconcile(
        _config({"devices": [4], "enabled": False}), inventory, {}
    )
    calls = _calls(sim)
    assert [c[0] for c in calls if c[0] != "destroy_compute_instance"] == [
        "destroy_gpu_instance",
        "destroy_gpu_instance",
        "destroy_gpu_instance",
        "set_mig_mode",
    ]
    gpu = outcome.inventory.gpus[4]
    assert not gpu.mig_enabled and gpu.mig_devices == ()
    assert outcome.states[gpu.uuid] == (MigState.APPLIED, None)


async def test_h200_partitioned_and_time_sliced_on_top() -> None:
    sim = RecordingNvml.from_preset("hgx-h200")
    inventory = discover(sim)
    config = _config(
        {"devices": [0, 1], "profiles": {"3g.71gb": 1, "1g.18gb": 2}},
        sharing={"timeSlicing": {"resources": [{"name": "nvidia.com/mig-1g.18gb", "replicas": 4}]}},
    )
    outcome = await MigReconciler(sim).reconcile(config, inventory, {})
    assert set(outcome.states.values()) == {(MigState.APPLIED, None)}
    assert sum(1 for c in _calls(sim) if c[0] == "set_mig_mode") == 2
    resources = {r.name: r for r in plan(config, outcome.inventory).resources}
    assert len(resources["nvidia.com/gpu"].devices) == 6
    assert len(resources["nvidia.com/mig-3g.71gb"].devices) == 2
    shared = resources["nvidia.com/mig-1g.18gb"].devices
    assert len(shared) == 2 * 2 * 4 and all(d.id.startswith("MIG-") for d in shared)


async def test_mode_change_needing_a_reset_is_pending_until_the_reset() -> None:
    sim = RecordingNvml(load_preset("hgx-h200"), mig_mode_needs_reset=True)
    inventory = discover(sim)
    config = _config({"devices": [0], "profiles": {"7g.141gb": 1}})
    reconciler = MigReconciler(sim)
    uuid = inventory.gpus[0].uuid

    first = await reconciler.reconcile(config, inventory, {})
    state, reason = first.states[uuid]
    assert state is MigState.PENDING and (reason or "").startswith(RESET_NEEDED)
    assert _calls(sim) == [("set_mig_mode", 0, None, None, "SUCCESS")]

    waiting = await reconciler.reconcile(config, first.inventory, {})
    assert waiting.states[uuid][0] is MigState.PENDING and _calls(sim) == []  # nothing forced

    reset_gpu(sim, 0)  # the admin resets the GPU
    done = await reconciler.reconcile(config, discover(sim), {})
    assert done.states[uuid] == (MigState.APPLIED, None)
    assert [m.profile for m in done.inventory.gpus[0].mig_devices] == ["7g.141gb"]


async def test_nvml_failure_is_the_gpus_error_state() -> None:
    sim = RecordingNvml.from_preset("a100-mig-mixed")
    inventory = discover(sim)
    config = _config(
        {"devices": [3], "profiles": {"7g.80gb": 1}}, {"devices": [2], "profiles": {"3g.40gb": 2}}
    )
    set_lost(sim, 3)
    outcome = await MigReconciler(sim).reconcile(config, inventory, {})
    state, reason = outcome.states[inventory.gpus[3].uuid]
    assert state is MigState.ERROR and "NVML_ERROR_GPU_IS_LOST" in (reason or "")
    assert outcome.states[inventory.gpus[2].uuid] == (MigState.APPLIED, None)  # others go on


async def test_unknown_holders_allow_creating_but_not_destroying() -> None:
    sim = RecordingNvml.from_preset("a100-mig-mixed")
    inventory = discover(sim)
    config = _config(
        {"devices": [3], "profiles": {"7g.80gb": 1}},  # empty GPU: only a creation
        {"devices": [0], "profiles": {"7g.80gb": 1}},  # needs three destroys first
    )
    outcome = await MigReconciler(sim).reconcile(config, inventory, None)
    assert outcome.states[inventory.gpus[3].uuid] == (MigState.APPLIED, None)
    state, reason = outcome.states[inventory.gpus[0].uuid]
    assert state is MigState.PENDING and "PodResources API did not answer" in (reason or "")
    assert {c[1] for c in _calls(sim)} == {3}
