"""partitioning.mig -> per-GPU MIG actions: selection, plans, pending and error reasons."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from sharing_plugin.config.model import Config
from sharing_plugin.gpus.holders import Holder
from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.mig.desired import RESET_NEEDED, GpuMigAction, MigActions, mig_actions
from sharing_plugin.nvml.discover import discover
from sharing_plugin.sim.nvml.simulated import SimulatedNvml


def _inventory(preset: str) -> Inventory:
    return discover(SimulatedNvml.from_preset(preset))


MIXED = _inventory("a100-mig-mixed")  # 0,1: 3g.40gb@0 2g.20gb@4 1g.10gb@6; 2: 7 x 1g; 3: empty
H200 = _inventory("hgx-h200")  # eight H200, MIG off


def _config(*entries: dict[str, Any]) -> Config:
    return Config.model_validate(
        {"flags": {"migStrategy": "mixed"}, "partitioning": {"mig": list(entries)}}
    )


def _only(result: MigActions) -> GpuMigAction:
    assert result.problems == ()
    (action,) = result.actions
    return action


def test_no_partitioning_means_no_actions() -> None:
    config = Config.model_validate({"flags": {"migStrategy": "mixed"}})
    assert mig_actions(config, MIXED) == MigActions((), ())
    assert mig_actions(_config(), MIXED) == MigActions((), ())


def test_layout_already_in_place_is_applied() -> None:
    action = _only(mig_actions(_config({"devices": [2], "profiles": {"1g.10gb": 7}}), MIXED))
    assert (action.state, action.changes, action.describe()) == ("applied", False, [])
    assert action.current_layout() == [f"1g.10gb@{s}" for s in range(7)]


def test_incremental_change_keeps_what_stays() -> None:
    config = _config({"devices": [0], "profiles": {"3g.40gb": 1, "1g.10gb": 3}})
    action = _only(mig_actions(config, MIXED))
    assert action.state == "change" and action.mode is None
    assert action.describe() == [
        f"destroy 2g.20gb at slices 4-5 ({MIXED.gpus[0].mig_devices[1].uuid})",
        "create 1g.10gb at slice 4",
        "create 1g.10gb at slice 5",
    ]
    assert action.desired_layout() == ["3g.40gb@0", "1g.10gb@4", "1g.10gb@5", "1g.10gb@6"]


def test_mig_off_gpu_gets_mode_on_then_instances() -> None:
    action = _only(mig_actions(_config({"devices": [0], "profiles": {"3g.71gb": 2}}), H200))
    assert action.mode == "enable" and action.current == ()
    assert action.describe() == [
        "enable MIG mode",
        "create 3g.71gb at slices 0-3",
        "create 3g.71gb at slices 4-7",
    ]


def test_disable_destroys_every_instance_first() -> None:
    action = _only(mig_actions(_config({"devices": [4], "enabled": False}), MIXED))
    assert action.mode == "disable"
    assert [line.split(" (")[0] for line in action.describe()] == [
        "destroy 4g.20gb at slices 0-3",
        "destroy 2g.10gb at slices 4-5",
        "destroy 1g.5gb+me at slice 6",
        "disable MIG mode",
    ]
    assert action.desired_layout() == [] and action.lines()[0].endswith("-> MIG off")


def test_mig_off_and_staying_off_is_nothing() -> None:
    action = _only(mig_actions(_config({"devices": [5], "enabled": False}), MIXED))
    assert action.state == "applied" and action.describe() == []


def test_impossible_layout_is_an_error_and_a_problem_at_profiles() -> None:
    config = _config({"devices": [4], "profiles": {"4g.20gb": 1, "2g.10gb": 2}})
    result = mig_actions(config, MIXED)
    (action,) = result.actions
    assert action.state == "error" and not action.changes
    assert "2g.10gb may start only at 0, 2 or 4" in (action.error or "")
    (problem,) = result.problems
    assert problem.path == "partitioning.mig[0].profiles"
    assert problem.message.startswith(f"GPU 4 ({MIXED.gpus[4].uuid}): 4g.20gb + 2 x 2g.10gb")


def test_profile_names_resolve_per_model() -> None:
    config = _config({"devices": [4], "profiles": {"3g.40gb": 1}})  # an A100-80GB name
    (problem,) = mig_actions(config, MIXED).problems
    assert "unknown MIG profile '3g.40gb' for A100-40GB: its profiles are 1g.5gb" in problem.message


def test_held_instance_in_the_way_is_pending_with_the_pod() -> None:
    held_mig = MIXED.gpus[0].mig_devices[0]  # 3g.40gb at 0-3
    config = _config({"devices": [0], "profiles": {"1g.10gb": 7}})
    result = mig_actions(
        config, MIXED, {f"{held_mig.uuid}::3": Holder("team-a", "train-0", "main")}
    )
    action = _only(result)
    assert action.state == "pending" and not action.changes
    assert action.pending is not None
    assert action.pending.startswith(f"waiting for pod team-a/train-0 to release {held_mig.uuid}")


def test_held_instance_that_stays_does_not_block() -> None:
    held_mig = MIXED.gpus[0].mig_devices[2]  # 1g.10gb at 6
    config = _config({"devices": [0], "profiles": {"3g.40gb": 1, "1g.10gb": 3}})
    action = _only(mig_actions(config, MIXED, {held_mig.uuid: Holder("ns", "p", "c")}))
    assert action.state == "change"
    assert action.plan is not None and held_mig.uuid in {k.id for k in action.plan.keep}


def test_held_whole_gpu_blocks_turning_mig_on() -> None:
    gpu = H200.gpus[1]
    config = _config({"devices": [1], "profiles": {"7g.141gb": 1}})
    action = _only(mig_actions(config, H200, {f"{gpu.uuid}::0": Holder("ns", "pod", "c")}))
    assert action.pending == (
        f"waiting for pod ns/pod to release {gpu.uuid} before MIG mode can be turned on"
    )


def test_held_instance_blocks_turning_mig_off() -> None:
    held_mig = MIXED.gpus[2].mig_devices[3]
    config = _config({"devices": [2], "enabled": False})
    action = _only(mig_actions(config, MIXED, {held_mig.uuid: Holder("ns", "pod", "c")}))
    assert action.state == "pending"
    assert f"release {held_mig.uuid} before MIG mode can be turned off" in (action.pending or "")


def test_mode_waiting_for_a_reset_is_pending_not_forced() -> None:
    gpu = replace(H200.gpus[0], mig_pending=True)  # MIG asked on, not reset yet
    inventory = Inventory(gpus=(gpu,))
    action = _only(mig_actions(_config({"profiles": {"7g.141gb": 1}}), inventory))
    assert action.state == "pending" and (action.pending or "").startswith(RESET_NEEDED)


@pytest.mark.parametrize(
    ("devices", "selected"),
    [
        ("all", [0, 1, 2, 3, 4, 5]),
        (2, [0, 1]),
        ([{"product": "*40GB"}], [4, 5]),
        ([{"product": "NVIDIA H100*"}], []),
        ([3, "1"], [1, 3]),
    ],
)
def test_selection(devices: Any, selected: list[int]) -> None:
    result = mig_actions(_config({"devices": devices, "enabled": False}), MIXED)
    assert result.problems == ()
    assert [a.gpu.index for a in result.actions] == selected


def test_selection_by_uuid_and_overlap_found_against_the_node() -> None:
    uuid = MIXED.gpus[3].uuid
    config = _config({"devices": [uuid], "enabled": False}, {"devices": [3], "enabled": False})
    result = mig_actions(config, MIXED)
    assert result.actions == ()  # the GPU gets neither layout
    (problem,) = result.problems
    assert problem.path == "partitioning.mig[1].devices"
    assert "which partitioning.mig[0] selects too" in problem.message


@pytest.mark.parametrize(
    ("devices", "path", "text"),
    [
        ([9], "partitioning.mig[0].devices[0]", "GPU 9 does not exist on this node (6 GPUs)"),
        (["0:1"], "partitioning.mig[0].devices[0]", "names a MIG device"),
        (7, "partitioning.mig[0].devices", "the first 7 MIG-capable GPUs, but this node has 6"),
    ],
)
def test_selection_problems(devices: Any, path: str, text: str) -> None:
    (problem,) = mig_actions(_config({"devices": devices, "enabled": False}), MIXED).problems
    assert problem.path == path and text in problem.message


def test_all_skips_gpus_without_mig_but_naming_one_is_an_error(tmp_path: Path) -> None:
    node = tmp_path / "node.yaml"
    node.write_text("gpus:\n  - product: NVIDIA A100-SXM4-40GB\n  - product: Tesla T4\n")
    inventory = discover(SimulatedNvml.from_file(node))
    everything = mig_actions(_config({"profiles": {"7g.40gb": 1}}), inventory)
    assert [a.gpu.index for a in everything.actions] == [0] and everything.problems == ()
    named = mig_actions(_config({"devices": [1], "profiles": {"7g.40gb": 1}}), inventory)
    (problem,) = named.problems
    assert problem.path == "partitioning.mig[0].profiles"
    assert "Tesla T4 does not support MIG" in problem.message
    off = mig_actions(_config({"devices": [1], "enabled": False}), inventory)
    assert off.problems == () and off.actions[0].state == "applied"


def test_json_and_lines() -> None:
    config = _config({"devices": [3], "profiles": {"3g.40gb": 1}})
    action = _only(mig_actions(config, MIXED))
    assert action.to_json() == {
        "gpu": MIXED.gpus[3].uuid,
        "index": 3,
        "product": "NVIDIA A100-SXM4-80GB",
        "entry": "partitioning.mig[0]",
        "migMode": {"current": True, "desired": True},
        "current": [],
        "desired": ["3g.40gb@0"],
        "actions": ["create 3g.40gb at slices 0-3"],
        "state": "change",
        "reason": None,
        "error": None,
    }
    assert action.lines() == [
        "GPU 3 (NVIDIA A100-SXM4-80GB): empty -> 3g.40gb@0",
        "  create 3g.40gb at slices 0-3",
    ]


# ---- dynamic entries: MIG mode on, the instances are the claims' ----------------------------


def test_a_dynamic_gpu_with_mig_off_gets_mig_mode_and_nothing_else() -> None:
    action = _only(mig_actions(_config({"devices": [1], "dynamic": True}), H200))
    assert action.dynamic and action.state == "change"
    assert action.describe() == ["enable MIG mode"]
    assert action.plan is not None and not action.plan.changes
    assert action.desired_layout() == ["dynamic"]
    assert action.to_json()["dynamic"] is True


def test_a_dynamic_gpu_keeps_every_instance_it_has() -> None:
    action = _only(mig_actions(_config({"devices": [0], "dynamic": True}), MIXED))
    assert (action.state, action.changes, action.describe()) == ("applied", False, [])
    assert action.plan is not None and len(action.plan.keep) == 3
    assert dict(action.desired) == {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1}
    assert action.lines() == [
        f"GPU 0 ({MIXED.gpus[0].product}): 3g.40gb@0 2g.20gb@4 1g.10gb@6 -> dynamic"
    ]


def test_a_claim_holding_a_whole_gpu_keeps_its_mig_mode_off() -> None:
    gpu = H200.gpus[2]
    config = _config({"devices": [2], "dynamic": True})
    action = _only(mig_actions(config, H200, {gpu.uuid: Holder("ns", "claim-0", "")}))
    assert action.pending == (
        f"waiting for ResourceClaim ns/claim-0 to release {gpu.uuid} before MIG mode can be "
        "turned on"
    )
