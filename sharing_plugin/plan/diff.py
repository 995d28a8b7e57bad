"""What a reload changes, as a value: which resource servers to start, stop or push to.

The supervisor computes `diff(old, new)` and then carries it out; nothing here does I/O. A
resource whose advertised list is identical (IDs, health, NUMA) is left alone entirely, so
kubelet sees no ListAndWatch message for it. `with_draining` keeps replicas that a new plan drops
but a pod still holds, advertised as Unhealthy, so that capacity never lies while they drain.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from sharing_plugin.plan.model import Plan, ResourcePlan, VirtualDevice


@dataclass(frozen=True, slots=True)
class PlanDiff:
    """Resource servers to start, stop, and push a new device list to; the rest stay as they are."""

    start: tuple[ResourcePlan, ...] = ()
    stop: tuple[str, ...] = ()
    push: tuple[ResourcePlan, ...] = ()
    unchanged: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.start or self.stop or self.push)

    def describe(self) -> str:
        parts = [
            *(f"+{r.name}" for r in self.start),
            *(f"-{name}" for name in self.stop),
            *(f"~{r.name}" for r in self.push),
        ]
        return " ".join(parts) if parts else "no change"


def advertised(resource: ResourcePlan) -> tuple[tuple[str, str, int | None], ...]:
    """What kubelet sees of a resource: the ordered (ID, health, NUMA node) list."""
    return tuple((d.id, d.health.value, d.numa) for d in resource.devices)


def diff(old: Plan | None, new: Plan) -> PlanDiff:
    """How to get from the resources of `old` (None: nothing running) to those of `new`.

    A resource whose devices are the same but whose Allocate behaviour changed (sharing kind,
    failRequestsGreaterThanOne) is pushed too: the snapshot must be swapped even though kubelet's
    view does not change; the server decides whether a ListAndWatch message is due.
    """
    before = {r.name: r for r in old.resources} if old is not None else {}
    start: list[ResourcePlan] = []
    push: list[ResourcePlan] = []
    unchanged: list[str] = []
    for resource in new.resources:
        previous = before.get(resource.name)
        if previous is None:
            start.append(resource)
        elif previous == resource:
            unchanged.append(resource.name)
        else:
            push.append(resource)
    names = {r.name for r in new.resources}
    stop = tuple(name for name in before if name not in names)
    return PlanDiff(start=tuple(start), stop=stop, push=tuple(push), unchanged=tuple(unchanged))


def with_draining(new: Plan, old: Plan | None, held: Mapping[str, frozenset[str]]) -> Plan:
    """`new`, plus every device of `old` that `new` drops while a pod holds it, as Unhealthy.

    `held` maps resource names to the device IDs pods hold (from PodResources). A resource that
    `new` removes entirely but whose devices are still held stays, with only those devices.
    """
    if old is None or not held:
        return new
    resources = {r.name: r for r in new.resources}
    for previous in old.resources:
        in_use = held.get(previous.name, frozenset())
        if not in_use:
            continue
        current = resources.get(previous.name)
        kept = set(current.ids) if current is not None else set()
        leaving = tuple(
            _draining(d) for d in previous.devices if d.id in in_use and d.id not in kept
        )
        if not leaving:
            continue
        if current is None:
            resources[previous.name] = replace(previous, devices=leaving)
        else:
            resources[previous.name] = replace(current, devices=current.devices + leaving)
    return replace(new, resources=tuple(resources[name] for name in sorted(resources)))


def draining_ids(new: Plan, undrained: Plan) -> dict[str, tuple[str, ...]]:
    """Per resource, the IDs that `new` (with draining) advertises beyond `undrained` (without)."""
    result: dict[str, tuple[str, ...]] = {}
    for resource in new.resources:
        base = undrained.resource(resource.name)
        base_ids = set(base.ids) if base is not None else set()
        extra = tuple(i for i in resource.ids if i not in base_ids)
        if extra:
            result[resource.name] = extra
    return result


def _draining(device: VirtualDevice) -> VirtualDevice:
    return device if not device.healthy else replace(device, healthy=False)
