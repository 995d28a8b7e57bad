"""What a reload changes, as a value: which resource servers to start, stop or push to.

The supervisor computes `diff(old, new)` and then carries it out; nothing here does I/O. A
resource whose advertised list is identical (IDs, health, NUMA) is left alone entirely, so
kubelet sees no ListAndWatch message for it. `with_draining` keeps devices that a new plan drops
but a pod still holds (or was just granted), advertised as Unhealthy, so that capacity never lies
while they drain.
"""

from __future__ import annotations

from collections.abc import Collection, Container, Mapping, Sequence
from dataclasses import dataclass, replace

from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.plan.model import (
    REPLICA_SEPARATOR,
    DeviceId,
    Plan,
    ResourcePlan,
    VirtualDevice,
    physical_of,
)


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


def with_draining(
    new: Plan,
    old: Plan | None,
    held: Mapping[str, Collection[str]],
    *,
    granted: Mapping[str, Sequence[VirtualDevice]] | None = None,
    node: Inventory | None = None,
) -> Plan:
    """`new`, plus every device a pod holds that `new` does not advertise, as Unhealthy.

    `held` maps resource names to the device IDs pods hold (PodResources); `granted` to the
    devices Allocate handed out that PodResources may not show yet (kubelet records a pod only
    after Allocate returns). A resource that `new` removes entirely but whose devices are still
    held stays, with only those devices.

    Where a draining device comes from: the grant, else `old` (what kubelet was told last), else
    it is rebuilt from its ID when its physical device is on this node (`node`, or the plans):
    after a restart there is no `old`, and a pod may hold a replica that the config dropped while
    the plugin was down. A resource this plugin neither advertises nor advertised is someone
    else's and left alone, except on that first plan, which has nothing to compare with.
    """
    granted = granted or {}
    if not any(held.values()) and not any(granted.values()):
        return new
    resources = {r.name: r for r in new.resources}
    rebuild = _Rebuilder(new, old, node)
    for name in sorted(set(held) | set(granted)):
        current = resources.get(name)
        previous = old.resource(name) if old is not None else None
        given: dict[str, VirtualDevice] = {d.id: d for d in granted.get(name, ())}
        if current is None and previous is None and not given and old is not None:
            continue
        kept: Container[str] = current if current is not None else frozenset()
        missing = {i for i in held.get(name, ()) if i not in kept} | {
            i for i in given if i not in kept
        }
        if not missing:
            continue
        ordered: list[str] = [d.id for d in previous.devices if d.id in missing] if previous else []
        ordered += sorted(missing.difference(ordered))
        leaving: list[VirtualDevice] = []
        for device_id in ordered:
            device = given.get(device_id) or (previous.device(device_id) if previous else None)
            device = device or rebuild(device_id)
            if device is not None:
                leaving.append(_draining(device))
        if not leaving:
            continue
        if current is None:
            source = previous or ResourcePlan(name=name, devices=())
            resources[name] = replace(source, devices=tuple(leaving))
        else:
            resources[name] = replace(current, devices=current.devices + tuple(leaving))
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


class _Rebuilder:
    """A stand-in for a held device known only by its ID, from what the node says about its
    physical device: a sibling replica in either plan, else the inventory. It is advertised
    Unhealthy, so kubelet never hands it out; only its ID, health and NUMA node matter."""

    def __init__(self, new: Plan, old: Plan | None, node: Inventory | None) -> None:
        self._plans = (new, old) if old is not None else (new,)
        self._node = node
        self._siblings: dict[str, VirtualDevice] | None = None

    def __call__(self, device_id: str) -> VirtualDevice | None:
        physical = physical_of(device_id)
        _, sep, suffix = device_id.partition(REPLICA_SEPARATOR)
        replica = int(suffix) if sep and suffix.isdigit() else None
        if sep and replica is None:
            return None  # not an ID this plugin makes
        if self._siblings is None:
            self._siblings = {
                d.physical: d for p in self._plans for r in p.resources for d in r.devices
            }
        sibling = self._siblings.get(physical) or self._from_node(physical)
        if sibling is None:
            return None
        return replace(sibling, id=DeviceId(device_id), replica=replica)

    def _from_node(self, physical: str) -> VirtualDevice | None:
        if self._node is None:
            return None
        gpu = self._node.gpu(physical)
        mig = self._node.mig_device(physical) if gpu is None else None
        parent = self._node.gpu(mig.parent_uuid) if mig is not None else gpu
        if parent is None:
            return None
        return VirtualDevice(
            id=DeviceId(physical),
            physical=physical,
            gpu_uuid=parent.uuid,
            index=str(parent.index) if mig is None else f"{parent.index}:{mig.index}",
            numa=parent.numa_node,
            paths=(),
            is_mig=mig is not None,
            compute_capability=parent.compute_capability,
        )
