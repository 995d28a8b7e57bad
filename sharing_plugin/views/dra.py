"""The plan as Dynamic Resource Allocation sees it: the node's devices, and what its pool holds.

Every advertised device of every resource becomes a DRA device in the node's pool, as the plan
partitions the GPUs: a GPU in a shared resource never appears also whole. How a shared GPU (or
MIG device) appears is the config's `dra.sharedDevices`:

- `capacity` (the default, Kubernetes 1.34+): one device with `allowMultipleAllocations` whose
  `memory` claims consume. Its request policy keeps the ConfigMap's meaning: a claim that asks
  nothing takes one replica's share (the device's memory / its replicas, or `memoryPerReplica`
  for MPS), a claim may ask more, rounded up to whole shares, and at most `replicas` claims
  asking nothing fit.
- `replicas`: one device per replica, each with the whole device's `memory` as a plain
  capacity (Kubernetes 1.32-1.33, or servers that do not keep the capacity fields).

What a device is travels as attributes the scheduler's CEL selectors read (docs/contract.md,
"DRA mode"): ours, and those NVIDIA's DRA driver publishes (see the attributes' own module):

    resource     string  the config's resource name, e.g. nvidia.com/gpu.shared
    uuid         string  the physical GPU or MIG device behind it
    sharing      string  none | time-slicing | mps
    index        int     the GPU's index
    migProfile   string  MIG devices only, e.g. 1g.10gb
    replica      int     one device per replica only, the replica number
    memory       capacity, the physical device's memory

Device names are DNS labels made of the physical UUID, and the replica number in the replica
model (`gpu-<uuid>`, `mig-<uuid>`, `gpu-<uuid>-r<n>`), so the same device keeps its name across
reloads and restarts, as its device plugin ID does. Everything here is pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sharing_plugin.config.base import SharedDevices, SharingKind
from sharing_plugin.config.model import Config
from sharing_plugin.config.rules import advertised_name
from sharing_plugin.errors import PlanError, Problem
from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.plan.model import Plan, ResourcePlan, VirtualDevice
from sharing_plugin.plan.node import NodePlan
from sharing_plugin.views.dra_api import (
    DEFAULT_DRIVER,
    MAX_STRING_ATTRIBUTE,
    V1,
    Capacity,
    DeviceTaint,
    PublishedDevice,
    device_class,
    dns_label,
    memory_quantity,
    resource_slices,
)
from sharing_plugin.views.dra_attributes import GpuFacts, device_attributes, gpu_facts
from sharing_plugin.views.dra_mig import dynamic_pool, placement_resources


def device_name(device: VirtualDevice) -> str:
    """The DRA device name of a virtual device: its physical UUID, plus `-r<n>` for replica n.

    Stable for the same physical device and replica, like the device plugin ID it mirrors.
    """
    suffix = "" if device.replica is None else f"-r{device.replica}"
    return dns_label(f"{device.physical}{suffix}")


@dataclass(frozen=True, slots=True)
class Shares:
    """A device published by capacity: `count` claims asking nothing fit, each `mib` of memory."""

    count: int
    mib: int


@dataclass(frozen=True, slots=True)
class DraDevice:
    """A device of the plan, with what DRA publishes about it.

    `device` is the plan's device behind it; for a shared device published by capacity
    (`shares` set), the first of its replicas: every replica answers Allocate alike.
    """

    name: str
    resource: str
    sharing: str
    device: VirtualDevice
    facts: GpuFacts
    gpu_index: int
    mig_profile: str | None
    memory_mib: int
    shares: Shares | None = None

    @property
    def healthy(self) -> bool:
        return self.device.healthy

    @property
    def gpu_uuid(self) -> str:
        return self.device.gpu_uuid

    def capacity(self) -> Capacity:
        """`memory`: the device's, with a request policy when claims consume it."""
        total = memory_quantity(self.memory_mib)
        if self.shares is None:
            return Capacity(total)
        share = memory_quantity(self.shares.mib)
        # The API wants min + step within the value: one share alone has no step.
        return Capacity(
            total,
            default=share,
            minimum=share,
            maximum=memory_quantity(self.shares.mib * self.shares.count),
            step=share if self.shares.count > 1 else None,
        )

    def published(self, taint: DeviceTaint | None = None) -> PublishedDevice:
        attributes = device_attributes(
            resource=self.resource,
            uuid=self.device.physical,
            facts=self.facts,
            sharing=self.sharing,
            index=self.gpu_index,
            mig_profile=self.mig_profile,
            parent_uuid=self.gpu_uuid if self.mig_profile is not None else None,
        )
        if self.shares is None and self.device.replica is not None:
            attributes["replica"] = {"int": self.device.replica}
        return PublishedDevice(
            name=self.name,
            attributes=attributes,
            capacity={"memory": self.capacity()},
            multiple_allocations=self.shares is not None,
            taints=(taint,) if taint is not None else (),
        )


def dra_devices(
    plan: Plan,
    inventory: Inventory,
    *,
    shared: SharedDevices = SharedDevices.CAPACITY,
) -> tuple[DraDevice, ...]:
    """Every device of `plan` as a DRA device, resources in name order, devices in plan order;
    a shared resource's devices as `shared` says (see the module doc).

    Raises `PlanError` for what the API cannot carry: a resource name longer than a string
    attribute may be, or two devices with one name.
    """
    devices: list[DraDevice] = []
    problems: list[Problem] = []
    pinned = _mps_pinned(plan)
    for resource in plan.resources:
        if len(resource.name) > MAX_STRING_ATTRIBUTE:
            problems.append(
                Problem(
                    "",
                    f"{resource.name}: a DRA attribute holds at most {MAX_STRING_ATTRIBUTE} "
                    f"characters, this resource name has {len(resource.name)}: shorten it",
                )
            )
            continue
        by_capacity = shared is SharedDevices.CAPACITY and resource.sharing is not SharingKind.NONE
        for device in _first_replicas(resource) if by_capacity else resource.devices:
            devices.append(
                _dra_device(resource, device, inventory, pinned if by_capacity else None)
            )
    seen: dict[str, DraDevice] = {}
    for d in devices:
        other = seen.setdefault(d.name, d)
        if other is not d:
            problems.append(
                Problem("", f"devices {other.device.id} and {d.device.id} share DRA name {d.name}")
            )
    if problems:
        raise PlanError(problems)
    return tuple(devices)


def _first_replicas(resource: ResourcePlan) -> list[VirtualDevice]:
    """One device per physical device of a shared resource: its first replica, in plan order."""
    first: dict[str, VirtualDevice] = {}
    for device in resource.devices:
        first.setdefault(device.physical, device)
    return list(first.values())


def _mps_pinned(plan: Plan) -> dict[tuple[str, str], int]:
    """(MPS resource, GPU UUID) -> the memory each of its clients may pin, in MiB."""
    return {(d.resource, g.uuid): g.pinned_memory_mib for d in plan.mps for g in d.devices}


def _dra_device(
    resource: ResourcePlan,
    device: VirtualDevice,
    inventory: Inventory,
    pinned: Mapping[tuple[str, str], int] | None,
) -> DraDevice:
    gpu = inventory.gpu(device.gpu_uuid)
    mig = inventory.mig_device(device.physical) if device.is_mig else None
    memory = mig.memory_mib if mig is not None else gpu.memory_mib if gpu else 0
    shares = None
    if pinned is not None:
        # A claim that asks nothing takes one replica's share; MPS clients pin at most their
        # limit (memoryPerReplica), never more than the device holds per replica.
        share = memory // max(device.replicas, 1)
        limit = pinned.get((resource.name, device.gpu_uuid))
        shares = Shares(device.replicas, min(share, limit) if limit else share)
    return DraDevice(
        name=dns_label(device.physical) if shares is not None else device_name(device),
        resource=resource.name,
        sharing=resource.sharing.value,
        device=device,
        facts=gpu_facts(gpu, inventory),
        gpu_index=gpu.index if gpu is not None else int(device.index.split(":")[0]),
        mig_profile=mig.profile if mig is not None else None,
        memory_mib=memory,
        shares=shares,
    )


def pool_devices(
    devices: Sequence[DraDevice],
    *,
    held: Iterable[str] = (),
    kept: Mapping[str, PublishedDevice] | None = None,
    taints: Mapping[str, DeviceTaint] | None = None,
    draining: DeviceTaint | None = None,
) -> tuple[PublishedDevice, ...]:
    """What the pool publishes: the plan's devices, then the held devices the plan dropped.

    An unhealthy device is published with its taint from `taints` (GPU or MIG UUID -> taint:
    the device's own, else its GPU's): it stays visible and is not allocated to new claims;
    without a taint for it (`taints` None: a server without device taints) it leaves the pool.
    `held` names devices of prepared claims; `kept` has what was published for them. A held
    device the plan no longer has stays published unchanged until its claim is unprepared (the
    draining rule); one several claims may share gets the `draining` taint as well, where given
    (a server that keeps taints), so that its free shares go to no new claim.
    """
    kept = kept or {}
    published: list[PublishedDevice] = []
    for d in devices:
        taint = _taint(d, taints) if not d.healthy else None
        if d.healthy or taint is not None:
            published.append(d.published(taint))
    planned = {d.name for d in devices}
    for name in sorted(set(held) - planned):
        if name not in kept:
            continue
        device = kept[name]
        if draining is not None and device.multiple_allocations and draining not in device.taints:
            device = replace(device, taints=(*device.taints, draining))
        published.append(device)
    return tuple(published)


def _taint(device: DraDevice, taints: Mapping[str, DeviceTaint] | None) -> DeviceTaint | None:
    if not taints:
        return None
    return taints.get(device.device.physical) or taints.get(device.gpu_uuid)


def config_resource_names(config: Config) -> set[str]:
    """The resource names a config names itself (patterns and sharing), whatever the node."""
    names = {p.name for p in (*config.resources.gpus, *config.resources.mig)}
    sharing = config.sharing.active
    if sharing is not None:
        names.update(advertised_name(entry, sharing) for entry in sharing.resources)
    return names


def dra_documents(
    config: Config,
    node_plan: NodePlan,
    node_name: str,
    driver_name: str = DEFAULT_DRIVER,
    *,
    api_version: str = V1,
    generation: int = 1,
) -> list[dict[str, Any]]:
    """What `run-dra` publishes for this node: one DeviceClass per resource name (those of the
    plan, those the config names and those of dynamic MIG placements), then the node's
    ResourceSlices. Healthy devices only, as the pool carries them; a dynamic GPU's placements
    and counter set as the node is now (before any claim)."""
    mig = dynamic_pool(config, node_plan.inventory)
    devices = [
        d
        for d in dra_devices(
            node_plan.plan,
            node_plan.inventory,
            shared=config.dra.shared_devices if api_version == V1 else SharedDevices.REPLICAS,
        )
        if d.gpu_uuid not in mig.gpu_uuids
    ]
    counter_sets, placements = mig.published()
    names = sorted(
        {r.name for r in node_plan.plan.resources}
        | config_resource_names(config)
        | placement_resources(mig)
    )
    classes = [device_class(n, driver_name, api_version=api_version) for n in names]
    slices = resource_slices(
        pool_devices(devices) + placements,
        counter_sets=counter_sets,
        node_name=node_name,
        driver=driver_name,
        generation=generation,
        api_version=api_version,
    )
    return [*classes, *slices]
