"""Which devices one sharing entry selects: its `devices` resolved against its resource.

Split from the sharing step so that sizing and building replicas read apart from resolving
selections (by index, UUID, MIG index, product), which is the larger half and has its own
messages.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sharing_plugin.config import devices as refs
from sharing_plugin.config.model import ReplicatedResource
from sharing_plugin.config.names import glob_matches
from sharing_plugin.errors import Problem
from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.plan.model import VirtualDevice

BaseDevices = dict[str, list[VirtualDevice]]
"""Resource name -> its devices before sharing, in GPU then MIG index order."""


@dataclass(slots=True)
class Found:
    """Devices an entry selects, and the problems and warnings found on the way."""

    devices: list[VirtualDevice]
    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def describe(device: VirtualDevice) -> str:
    kind = "MIG device" if device.is_mig else "GPU"
    return f"{kind} {device.index} ({device.physical})"


class DeviceSelector:
    """Resolves one entry's `devices` against the devices of its resource."""

    def __init__(self, inventory: Inventory, base: BaseDevices) -> None:
        self.inventory = inventory
        self.owner = {d.physical: name for name, devices in base.items() for d in devices}

    def select(self, entry: ReplicatedResource, devices: list[VirtualDevice], path: str) -> Found:
        """The devices `entry` selects among `devices`, with what is wrong or worth saying."""
        selection: refs.DeviceSelection = entry.devices
        if selection == "all":
            if devices:
                return Found(list(devices))
            return Found(
                [],
                warnings=[
                    f"{path}.name: this node has no {entry.name} devices, so this entry "
                    "shares nothing here"
                ],
            )
        if isinstance(selection, int):
            if selection > len(devices):
                return Found(
                    [],
                    problems=[
                        Problem(
                            f"{path}.devices",
                            f"asks for the first {selection} {entry.name} devices, but this "
                            f"node has {len(devices)}: lower the count or list the devices",
                        )
                    ],
                )
            return Found(list(devices[:selection]))
        found = Found([])
        chosen: dict[str, VirtualDevice] = {}
        for j, ref in enumerate(selection):
            ref_path = f"{path}.devices[{j}]"
            matched = [d for d in devices if self._matches(ref, d)]
            if not matched:
                if isinstance(ref, refs.ProductRef):
                    found.warnings.append(
                        f"{ref_path}: no {entry.name} device on this node is on a GPU whose "
                        f"product matches {ref.product!r}, so it selects nothing"
                    )
                else:
                    found.problems.append(Problem(ref_path, self._missing(ref, entry.name)))
            for d in matched:
                chosen.setdefault(d.physical, d)
        order = {d.physical: i for i, d in enumerate(devices)}
        found.devices.extend(sorted(chosen.values(), key=lambda d: order[d.physical]))
        return found

    def _matches(self, ref: refs.DeviceRef, device: VirtualDevice) -> bool:
        if isinstance(ref, refs.GpuIndexRef):
            return not device.is_mig and device.index == str(ref.index)
        if isinstance(ref, refs.MigIndexRef):
            return device.is_mig and device.index == f"{ref.gpu}:{ref.mig}"
        if isinstance(ref, refs.UuidRef):
            return device.physical == ref.uuid
        if isinstance(ref, refs.MigGiCiRef):
            mig = self.inventory.mig_device(device.physical) if device.is_mig else None
            return (
                mig is not None
                and mig.parent_uuid == ref.gpu_uuid
                and (mig.gi_id, mig.ci_id) == (ref.gi, ref.ci)
            )
        gpu = self.inventory.gpu(device.gpu_uuid)
        return gpu is not None and glob_matches(ref.product, gpu.product)

    def _missing(self, ref: refs.DeviceRef, name: str) -> str:
        """Why a reference selects nothing, and where the device it names went instead."""
        what, physical = self._locate(ref)
        if physical is None:
            return f"{what} does not exist on this node: {self._node_summary()}"
        owner = self.owner.get(physical)
        if owner is None:
            return (
                f"{what} is not advertised on this node under the current migStrategy "
                f"(it is MIG-enabled, or MIG is off on its GPU), so it cannot be shared as {name}"
            )
        return f"{what} is advertised as {owner}, not {name}: move it to an entry named {owner}"

    def _locate(self, ref: refs.DeviceRef) -> tuple[str, str | None]:
        inv = self.inventory
        if isinstance(ref, refs.GpuIndexRef):
            gpu = next((g for g in inv.gpus if g.index == ref.index), None)
            return f"GPU {ref.index}", gpu.uuid if gpu else None
        if isinstance(ref, refs.MigIndexRef):
            mig = next(
                (
                    m
                    for g in inv.gpus
                    if g.index == ref.gpu
                    for m in g.mig_devices
                    if m.index == ref.mig
                ),
                None,
            )
            return f"MIG device {ref.gpu}:{ref.mig}", mig.uuid if mig else None
        if isinstance(ref, refs.UuidRef):
            known = inv.gpu(ref.uuid) or inv.mig_device(ref.uuid)
            return f"device {ref.uuid}", ref.uuid if known else None
        if isinstance(ref, refs.MigGiCiRef):
            mig = next(
                (
                    m
                    for g in inv.gpus
                    for m in g.mig_devices
                    if m.parent_uuid == ref.gpu_uuid and (m.gi_id, m.ci_id) == (ref.gi, ref.ci)
                ),
                None,
            )
            label = f"MIG device MIG-{ref.gpu_uuid}/{ref.gi}/{ref.ci}"
            return label, mig.uuid if mig else None
        return f"product {ref.product!r}", None

    def _node_summary(self) -> str:
        gpus = self.inventory.gpus
        if not gpus:
            return "the node has no GPUs"
        parts = []
        for g in sorted(gpus, key=lambda g: g.index):
            migs = ", ".join(f"{g.index}:{m.index}" for m in g.mig_devices)
            parts.append(f"{g.index}" + (f" (MIG {migs})" if migs else ""))
        return "it has GPU " + ", ".join(parts)
