"""What one resource's server answers from: a snapshot of its plan, swapped whole on a reload.

Every call of the DevicePlugin service reads the current `Snapshot` once, at its start (see the
servicer). A snapshot holds the resource's devices, what Allocate needs besides them, the
ListAndWatch bytes serialised once, and the devices a reload withdrew while Healthy, honoured
for a short while since kubelet may already have promised them to a pod.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from sharing_plugin.config.model import Flags
from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.kubelet import translate
from sharing_plugin.plan import CONTROL_DEVICE_NODES, ResourcePlan, VirtualDevice


@dataclass(frozen=True)
class AllocateContext:
    """What Allocate and GetPreferredAllocation need besides the resource's devices."""

    flags: Flags
    inventory: Inventory | None = None
    control_nodes: tuple[str, ...] = CONTROL_DEVICE_NODES


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One consistent view of a resource: its plan, the flags, and the ListAndWatch message,
    serialised (`payload`).

    `withdrawn`: devices an earlier snapshot advertised Healthy that this one does not, each
    with the loop time until which Allocate still honours it.
    """

    resource: ResourcePlan
    context: AllocateContext
    key: translate.DeviceKey
    payload: bytes = field(compare=False)
    withdrawn: Mapping[str, tuple[VirtualDevice, float]] = field(
        default_factory=dict, compare=False
    )

    def serving(self, ids: Sequence[str], now: float) -> tuple[ResourcePlan, bool]:
        """The resource to answer a request for `ids` from, and whether it had to honour
        withdrawn devices. An ID neither advertised nor honoured is left for `allocate` to
        refuse."""
        if not self.withdrawn or all(i in self.resource for i in ids):
            return self.resource, False
        late: dict[str, VirtualDevice] = {}
        for device_id in ids:
            if device_id in self.resource or device_id in late:
                continue
            entry = self.withdrawn.get(device_id)
            if entry is None or entry[1] < now:
                return self.resource, False
            late[device_id] = entry[0]
        return replace(self.resource, devices=self.resource.devices + tuple(late.values())), True


def snapshot(
    resource: ResourcePlan,
    context: AllocateContext,
    *,
    previous: Snapshot | None = None,
    now: float = 0.0,
    honour_s: float = 0.0,
) -> Snapshot:
    """A snapshot of `resource`; after `previous`, honouring for `honour_s` (from `now`) the
    Healthy devices that `previous` advertised and `resource` drops."""
    key = translate.device_key(resource)
    withdrawn: dict[str, tuple[VirtualDevice, float]] = {}
    if previous is not None:
        withdrawn = {
            i: entry
            for i, entry in previous.withdrawn.items()
            if entry[1] >= now and i not in resource
        }
        if key != previous.key:
            until = now + honour_s
            for device in previous.resource.devices:
                if device.healthy and device.id not in resource:
                    withdrawn[device.id] = (device, until)
    return Snapshot(
        resource=resource,
        context=context,
        key=key,
        payload=translate.list_response(resource.devices).SerializeToString(),
        withdrawn=withdrawn,
    )
