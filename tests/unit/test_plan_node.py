"""The node pipeline: one function from (config, node, held devices) to MIG actions and plan."""

from __future__ import annotations

from typing import Any

import pytest

from sharing_plugin.config.model import Config
from sharing_plugin.errors import PlanError
from sharing_plugin.gpus.holders import Holder
from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.mig.predict import is_planned
from sharing_plugin.mig.state import GpuMigState, MigState, state_of
from sharing_plugin.nvml.discover import discover
from sharing_plugin.plan.node import NodePlan, plan_node
from sharing_plugin.sim.nvml.simulated import SimulatedNvml

MIXED = discover(SimulatedNvml.from_preset("a100-mig-mixed"))  # GPU 3: MIG on, no instances


def _config(**sections: Any) -> Config:
    return Config.model_validate({"flags": {"migStrategy": "mixed"}, **sections})


SEVEN_ON_GPU_3 = {"mig": [{"devices": [3], "profiles": {"1g.10gb": 7}}]}


def _ids(inventory: Inventory, resource: str, config: Config, **kw: Any) -> list[str]:
    node = plan_node(config, inventory, **kw)
    found = [r for r in node.plan.resources if r.name == resource]
    return [d.physical for r in found for d in r.devices]


def mig_states(node: NodePlan) -> dict[str, GpuMigState]:
    """Per GPU a `partitioning.mig` entry selects, where its layout stands."""
    return {action.gpu.uuid: state_of(action) for action in node.actions}


def test_without_partitioning_the_node_is_planned_as_it_is() -> None:
    node = plan_node(_config(), MIXED)
    assert node.actions == () and node.problems == ()
    assert node.inventory is MIXED
    assert mig_states(node) == {}
    assert node.warnings == MIXED.warnings


def test_declared_layout_is_planned_on_the_node_it_will_leave() -> None:
    config = _config(partitioning=SEVEN_ON_GPU_3)
    node = plan_node(config, MIXED)
    gpu3 = node.inventory.gpus[3]
    assert [m.profile for m in gpu3.mig_devices] == ["1g.10gb"] * 7
    planned = [i for i in _ids(MIXED, "nvidia.com/mig-1g.10gb", config) if is_planned(i)]
    assert len(planned) == 7
    assert any("do not exist yet" in w for w in node.warnings)
    # The GPU still has to change: its state is an error until it has (never "applied").
    assert mig_states(node)[gpu3.uuid].state is MigState.ERROR


def test_as_is_never_plans_instances_yet_to_be_created() -> None:
    config = _config(partitioning=SEVEN_ON_GPU_3)
    node = plan_node(config, MIXED, as_is=True)
    assert node.inventory is MIXED
    ids = _ids(MIXED, "nvidia.com/mig-1g.10gb", config, as_is=True)
    assert ids and not any(is_planned(i) for i in ids)
    assert not any("do not exist yet" in w for w in node.warnings)


def test_held_instance_makes_the_layout_pending_and_unchanged() -> None:
    gpu0 = MIXED.gpus[0]
    held_mig = gpu0.mig_devices[0]  # 3g.40gb at slice 0, in the way of seven 1g.10gb
    config = _config(partitioning={"mig": [{"devices": [0], "profiles": {"1g.10gb": 7}}]})
    node = plan_node(config, MIXED, {held_mig.uuid: Holder("ns", "pod", "c")})
    state = mig_states(node)[gpu0.uuid]
    assert state.state is MigState.PENDING
    assert state.reason is not None and "waiting for pod ns/pod" in state.reason
    assert node.inventory.gpus[0] == gpu0  # pending: planned as it is


def test_impossible_layout_is_a_problem_and_its_state_an_error() -> None:
    config = _config(partitioning={"mig": [{"devices": [3], "profiles": {"7g.80gb": 2}}]})
    node = plan_node(config, MIXED)
    assert [p.path for p in node.problems] == ["partitioning.mig[0].profiles"]
    assert mig_states(node)[MIXED.gpus[3].uuid] == GpuMigState(
        MigState.ERROR, node.actions[0].error
    )


def test_config_not_fitting_the_node_raises_with_layout_problems_first() -> None:
    config = _config(
        partitioning={"mig": [{"devices": [3], "profiles": {"7g.80gb": 2}}]},
        sharing={
            "timeSlicing": {
                "resources": [{"name": "nvidia.com/gpu", "replicas": 2, "devices": [9]}]
            }
        },
    )
    with pytest.raises(PlanError) as caught:
        plan_node(config, MIXED)
    paths = [p.path for p in caught.value.problems]
    assert paths[0] == "partitioning.mig[0].profiles"
    assert any(p.startswith("sharing.timeSlicing.resources[0]") for p in paths[1:])
