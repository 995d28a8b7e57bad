"""Whether each GPU keeps the memory caps of its shares, and the plan that follows from it.

The driver caps a cgroup's GPU memory from R615 on, on cgroup v2, when the container toolkit's
CDI hook runs as the container starts. What the node says about each of those is found by the
adapters and handed here as `NodeFacts`; this decides per GPU, as a value the plan carries:

- `best-effort`: a GPU that cannot enforce keeps its shares, advertised as before, uncapped;
- `required`: its shared replicas are not advertised (whole GPUs and MIG devices are: they
  carry no cap); a replica a pod holds stays advertised as draining through the reload diff,
  as any replica a config removes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sharing_plugin.config.memory import Enforcement, MemoryLimits
from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.plan.model import CapState, MemoryLimitState, Plan, VirtualDevice

FIRST_DRIVER = 615  # R615: nvmlDeviceSetMemoryLimits_v1


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What the node says about enforcing caps; each `None` where it is fine."""

    cgroup_version: int | None = None  # None: could not be told
    hook_problem: str | None = "the CDI hook was not checked"  # why it cannot run at hookPath


def driver_major(version: str) -> int:
    """`615.25.01` -> 615; 0 for text that starts with no number."""
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else 0


def node_reason(inventory: Inventory, facts: NodeFacts) -> str | None:
    """Why no GPU of this node can enforce caps (None: the node can)."""
    if driver_major(inventory.driver_version) < FIRST_DRIVER:
        found = inventory.driver_version or "unknown"
        return f"driver {found} is older than R{FIRST_DRIVER}, the first to cap a cgroup's memory"
    if facts.cgroup_version != 2:
        found = "unknown" if facts.cgroup_version is None else f"v{facts.cgroup_version}"
        return f"the node's cgroup hierarchy is {found}: caps need cgroup v2"
    return facts.hook_problem


def cap_states(
    limits: MemoryLimits, inventory: Inventory, facts: NodeFacts
) -> MemoryLimitState | None:
    """Each GPU's state, or None with `memoryLimits` off."""
    if not limits.on:
        return None
    reason = node_reason(inventory, facts)
    states: dict[str, CapState] = {}
    for gpu in inventory.gpus:
        if gpu.mig_enabled:
            states[gpu.uuid] = CapState(False, "MIG mode is on: its devices are isolated already")
        else:
            states[gpu.uuid] = CapState(reason is None, reason)
    return MemoryLimitState(limits.enforce, states)


def _kept(device: VirtualDevice, state: MemoryLimitState) -> VirtualDevice | None:
    if device.memory_cap_mib is None:
        return device
    gpu = state.gpus.get(device.gpu_uuid)
    if gpu is not None and gpu.enforced:
        return device
    if state.enforce is Enforcement.REQUIRED:
        return None
    return replace(device, memory_cap_mib=None)


def with_cap_states(plan: Plan, state: MemoryLimitState) -> Plan:
    """`plan` with each GPU's state applied (see the module doc), and a warning per reason."""
    resources = []
    for resource in plan.resources:
        kept = [k for d in resource.devices if (k := _kept(d, state)) is not None]
        resources.append(replace(resource, devices=tuple(kept)))
    warnings = list(plan.warnings)
    unenforced: dict[str, list[str]] = {}
    capped_gpus = {d.gpu_uuid for r in plan.resources for d in r.devices if d.memory_cap_mib}
    for uuid, gpu in state.gpus.items():
        if uuid in capped_gpus and not gpu.enforced and gpu.reason is not None:
            unenforced.setdefault(gpu.reason, []).append(uuid)
    outcome = (
        "the shared replicas there are not advertised (memoryLimits.enforce: required)"
        if state.enforce is Enforcement.REQUIRED
        else "the replicas there are advertised uncapped (memoryLimits.enforce: best-effort)"
    )
    for reason, uuids in unenforced.items():
        gpus = ", ".join(uuids[:3]) + (f" and {len(uuids) - 3} more" if len(uuids) > 3 else "")
        warnings.append(f"memoryLimits: {gpus}: caps cannot be enforced ({reason}): {outcome}")
    # A resource left without devices stays, advertising none: the kubelet sees its capacity
    # go to zero, as for a config that selects nothing.
    return replace(plan, resources=tuple(resources), warnings=tuple(warnings), memory_limits=state)
