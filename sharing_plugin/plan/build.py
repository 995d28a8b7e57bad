"""`plan()`: from a config and a node's inventory to the devices each resource advertises.

Two steps, as the reference plugin takes them: first every GPU or MIG device gets a resource name
(the MIG strategy decides which of the two a MIG-enabled GPU contributes, `resources` patterns
rename them), then sharing turns selected devices into replicas. Every problem is collected
before raising, so an admin sees all of them at once, each with the config path to fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from sharing_plugin.config.advice import plan_envvar_trap
from sharing_plugin.config.model import (
    MAX_DEVICES_PER_RESOURCE,
    Config,
    MigStrategy,
    ResourcePattern,
)
from sharing_plugin.config.names import glob_matches
from sharing_plugin.errors import PlanError, Problem
from sharing_plugin.gpus.inventory import Gpu, Inventory, MigDevice
from sharing_plugin.plan.caps import NodeFacts, cap_states, with_cap_states
from sharing_plugin.plan.model import DeviceId, Plan, ResourcePlan, VirtualDevice
from sharing_plugin.plan.share import BaseDevices, apply_sharing, too_many_devices

DEFAULT_GPU_RESOURCE = "nvidia.com/gpu"
MIG_STRATEGY_PATH = "flags.migStrategy"

# The driver numbers MIG capability device nodes (/proc/driver/nvidia-caps/mig-minors): minors 1
# and 2 are `config` and `monitor`, then per GPU minor g, per GPU instance gi (0..14) one `access`
# minor followed by one per compute instance ci (0..7): 15 * 9 = 135 minors per GPU.
_CAP_FIRST = 3
_CAPS_PER_GI = 9
_CAPS_PER_GPU = 15 * _CAPS_PER_GI


def mig_capability_paths(gpu_minor: int, gi: int, ci: int) -> tuple[str, str]:
    """The /dev/nvidia-caps nodes granting access to one GPU instance and one compute instance."""
    gi_minor = _CAP_FIRST + gpu_minor * _CAPS_PER_GPU + gi * _CAPS_PER_GI
    return (
        f"/dev/nvidia-caps/nvidia-cap{gi_minor}",
        f"/dev/nvidia-caps/nvidia-cap{gi_minor + 1 + ci}",
    )


def _first_match(patterns: tuple[ResourcePattern, ...], text: str) -> str | None:
    return next((p.name for p in patterns if glob_matches(p.pattern, text)), None)


def _mig_resource_name(config: Config, profile: str) -> str:
    single = config.flags.mig_strategy is MigStrategy.SINGLE
    if single and _first_match(config.resources.mig, profile) is None:
        return DEFAULT_GPU_RESOURCE
    return profile_resource_name(config, profile)


def profile_resource_name(config: Config, profile: str) -> str:
    """The resource a MIG device of `profile` is advertised under on its own (the mixed
    strategy's name, or the first `resources.mig` pattern that matches it)."""
    named = _first_match(config.resources.mig, profile)
    if named is not None:
        return named
    # Resource names allow no `+`: the reference advertises 1g.10gb+me as mig-1g.10gb.me.
    return "nvidia.com/mig-" + profile.replace("+", ".")


def _gpu_device(gpu: Gpu) -> VirtualDevice:
    return VirtualDevice(
        id=DeviceId(gpu.uuid),
        physical=gpu.uuid,
        gpu_uuid=gpu.uuid,
        index=str(gpu.index),
        numa=gpu.numa_node,
        paths=(f"/dev/nvidia{gpu.minor}",),
        healthy=gpu.healthy_at_discovery,
        discovered_healthy=gpu.healthy_at_discovery,
        compute_capability=gpu.compute_capability,
    )


def mig_virtual_device(gpu: Gpu, mig: MigDevice) -> VirtualDevice:
    """A MIG device as the plan advertises it (and as a DRA claim is given it)."""
    return VirtualDevice(
        id=DeviceId(mig.uuid),
        physical=mig.uuid,
        gpu_uuid=gpu.uuid,
        index=f"{gpu.index}:{mig.index}",
        numa=gpu.numa_node,
        paths=(f"/dev/nvidia{gpu.minor}", *mig_capability_paths(gpu.minor, mig.gi_id, mig.ci_id)),
        healthy=gpu.healthy_at_discovery,
        discovered_healthy=gpu.healthy_at_discovery,
        is_mig=True,
        compute_capability=gpu.compute_capability,
    )


class _Advertised(NamedTuple):
    """Every device under its resource name before sharing, and what is wrong with them."""

    base: BaseDevices
    problems: list[Problem]
    warnings: list[str]


def _advertised(config: Config, inventory: Inventory) -> _Advertised:
    """Every device under its resource name before sharing, in GPU then MIG index order."""
    problems: list[Problem] = []
    warnings: list[str] = []
    strategy = config.flags.mig_strategy
    # A declared MIG layout will create the missing MIG devices; until then it is not an error.
    layout_declared = config.partitioning is not None and bool(config.partitioning.mig)
    base: BaseDevices = {}
    mig_gpus: list[Gpu] = []
    whole_gpus: list[Gpu] = []
    for gpu in sorted(inventory.gpus, key=lambda g: g.index):
        if gpu.mig_enabled and strategy is not MigStrategy.NONE:
            mig_gpus.append(gpu)
            if not gpu.mig_devices:
                message = (
                    f"GPU {gpu.index} ({gpu.uuid}) has MIG enabled but no MIG devices, so it "
                    f"advertises nothing under migStrategy {strategy.value}: create MIG devices "
                    "on it (partitioning.mig) or disable its MIG mode"
                )
                # Mixed advertises each MIG device on its own, so an empty GPU only advertises
                # nothing; single promises uniform devices and must refuse (the rule).
                if layout_declared or strategy is MigStrategy.MIXED:
                    warnings.append(f"{MIG_STRATEGY_PATH}: {message}")
                else:
                    problems.append(Problem(MIG_STRATEGY_PATH, message))
            for mig in sorted(gpu.mig_devices, key=lambda m: m.index):
                name = _mig_resource_name(config, mig.profile)
                base.setdefault(name, []).append(mig_virtual_device(gpu, mig))
        else:
            whole_gpus.append(gpu)
            name = _first_match(config.resources.gpus, gpu.product) or DEFAULT_GPU_RESOURCE
            base.setdefault(name, []).append(_gpu_device(gpu))
    if strategy is MigStrategy.SINGLE:
        problems.extend(_single_strategy_problems(mig_gpus, whole_gpus))
    return _Advertised(base, problems, warnings)


def _single_strategy_problems(mig_gpus: list[Gpu], whole_gpus: list[Gpu]) -> list[Problem]:
    """The reference's two rules for migStrategy single, each violation reported on its own."""
    problems: list[Problem] = []
    profiles: dict[str, list[int]] = {}
    for gpu in mig_gpus:
        for mig in gpu.mig_devices:
            on = profiles.setdefault(mig.profile, [])
            if gpu.index not in on:
                on.append(gpu.index)
    if len(profiles) > 1:
        found = ", ".join(
            f"{profile} on GPU {', '.join(map(str, gpus))}" for profile, gpus in profiles.items()
        )
        problems.append(
            Problem(
                MIG_STRATEGY_PATH,
                f"migStrategy single needs MIG devices of one profile on the whole node, found "
                f"{found}: repartition to one profile, or use migStrategy mixed",
            )
        )
    if profiles and whole_gpus:
        mig_indexes = ", ".join(str(g.index) for g in mig_gpus if g.mig_devices)
        for gpu in whole_gpus:
            problems.append(
                Problem(
                    MIG_STRATEGY_PATH,
                    f"migStrategy single needs the same MIG mode on every GPU, but GPU "
                    f"{gpu.index} ({gpu.uuid}) has MIG disabled while GPU {mig_indexes} advertise "
                    "MIG devices: enable MIG on it, or use migStrategy mixed",
                )
            )
    return problems


def _size_problems(resources: list[ResourcePlan], sources: Mapping[str, str]) -> list[Problem]:
    return [
        too_many_devices(r.name, len(r.devices), sources.get(r.name, ""))
        for r in resources
        if len(r.devices) > MAX_DEVICES_PER_RESOURCE
    ]


def plan(
    config: Config,
    inventory: Inventory,
    *,
    health: Mapping[str, bool] | None = None,
    facts: NodeFacts | None = None,
) -> Plan:
    """What `config` advertises on the node described by `inventory`.

    `health` maps GPU or MIG UUIDs to their current health (missing: healthy); it is ignored
    when the config disables health checks. `facts` is what the node says about enforcing
    memory caps (missing: nothing checked, so `memoryLimits` finds no GPU that enforces).
    Raises `PlanError` with every problem found when the config does not fit this node.
    """
    advertised = _advertised(config, inventory)
    shared = apply_sharing(config, inventory, advertised.base)
    problems = [
        *advertised.problems,
        *shared.problems,
        *_size_problems(shared.resources, shared.sources),
    ]
    warnings = [*advertised.warnings, *shared.warnings]
    if problems:
        raise PlanError(problems)
    resources = tuple(sorted(shared.resources, key=lambda r: r.name))
    trap = plan_envvar_trap(config, [r.name for r in resources if r.devices])
    if trap is not None:
        warnings.append(trap)
    result = Plan(resources=resources, warnings=tuple(warnings), mps=shared.mps)
    states = cap_states(config.memory_limits, inventory, facts or NodeFacts())
    if states is not None:
        result = with_cap_states(result, states)
    if health and config.health.enabled and not all(health.values()):
        result = result.with_health(health)
    return result
