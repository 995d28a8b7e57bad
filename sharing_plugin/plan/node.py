"""The node pipeline: (config, node, what pods hold) -> MIG actions, the node to be, its plan.

One function answers "what will this config do to this node", for the `plan` command and for
the daemon alike, so what an admin previews is what the plugin carries out. The declared MIG
layouts are decided first (pure, against the model's placement table and the instances pods
hold); the rest of the config is then planned on the node as those layouts will leave it, so a
config that would not fit is refused before any instance is created or destroyed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sharing_plugin.config.model import Config
from sharing_plugin.errors import PlanError, Problem
from sharing_plugin.gpus.holders import Holder
from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.mig.desired import NOTHING_HELD, GpuMigAction, mig_actions
from sharing_plugin.mig.predict import PLANNED_PREFIX, is_planned, predicted_inventory
from sharing_plugin.plan.build import plan
from sharing_plugin.plan.caps import NodeFacts
from sharing_plugin.plan.model import Plan


@dataclass(frozen=True, slots=True)
class NodePlan:
    """What a config does to a node: MIG actions, the node as it will be, and its plan.

    `problems` are the declared layouts that cannot be had (the config is invalid for this node
    even though the rest of it plans); `warnings` are the node's own (GPUs that did not answer,
    uncatalogued products) and placeholders for MIG devices that do not exist yet.
    """

    actions: tuple[GpuMigAction, ...]
    problems: tuple[Problem, ...]
    inventory: Inventory  # the node as it will be (as it is when nothing is to change)
    plan: Plan
    warnings: tuple[str, ...]


def plan_node(
    config: Config,
    inventory: Inventory,
    held: Mapping[str, Holder] | None = NOTHING_HELD,
    *,
    as_is: bool = False,
    facts: NodeFacts | None = None,
) -> NodePlan:
    """What `config` does to the node `inventory` describes.

        `held` maps device IDs pods hold to the pod (None: unknown), as `mig_actions` takes it.
        With `as_is`, the plan is of the node as it is now, without instances yet to be created:
        what may be advertised to kubelet, which never sees a placeholder ID. `facts`: what the node
    says about enforcing memory caps (see `plan`). Raises `PlanError`
        with every problem (declared layouts first) when the rest of the config does not fit.
    """
    mig = mig_actions(config, inventory, held)
    node = inventory if as_is else predicted_inventory(inventory, mig.actions)
    try:
        result = plan(config, node, facts=facts)
    except PlanError as exc:
        raise PlanError((*mig.problems, *exc.problems)) from None
    warnings = list(inventory.warnings)
    planned = sum(1 for r in result.resources for d in r.devices if is_planned(d.physical))
    if planned:
        warnings.append(
            f"{planned} device(s) are on MIG instances that do not exist yet: the plugin creates "
            f"them when it applies partitioning.mig; their {PLANNED_PREFIX}... IDs here stand "
            "in for the UUIDs NVML will give them"
        )
    return NodePlan(
        actions=mig.actions,
        problems=mig.problems,
        inventory=node,
        plan=result,
        warnings=tuple(warnings),
    )
