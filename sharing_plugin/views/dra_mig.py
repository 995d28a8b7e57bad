"""Dynamic MIG in DRA terms: a GPU's MIG placements as partitionable devices over its counters.

For each GPU a `partitioning.mig` entry marks `dynamic`, the pool holds one counter set and one
device per placement of the model's table (`<profile>@<start>`, docs/contract.md "DRA mode").
The counter set has a counter per memory slice (value 1), one for the compute slices and, where
a profile of the model carries media extensions, one for the GPU's single set of them (value 1).
A placement consumes the memory slices its instance would occupy, its compute slices and, for a
`+me` profile, the media extensions. The allocator never lets what the devices it allocated
consume pass a counter, so the placements it allocates together are ones the GPU can hold
together: that is the MIG solver's rule set, exactly (tests/unit/test_views_dra_mig_counters.py
checks it for every catalogued model). The instance itself is created when a claim allocated
the device is prepared, and destroyed when it is unprepared.

An instance that exists on such a GPU without a prepared claim holding it (an earlier run's,
or one made by hand) occupies its slices whatever the allocator believes. Its consumption is
taken off the GPU's counters, and the device of the placement it occupies is published
consuming nothing: a claim allocated that device adopts the instance, and any placement that
needs its slices cannot be allocated. Once a claim holds the device, it consumes like any
other and the counters are whole again, because the allocator now counts it itself.

Everything here is pure: the values come from the config, the inventory (with the instances as
they are now) and which devices prepared claims hold.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache

from sharing_plugin.config.model import Config
from sharing_plugin.gpus.catalog import MigModel, MigProfileSpec, model_for
from sharing_plugin.gpus.inventory import Gpu, Inventory, MigPlacement
from sharing_plugin.mig.desired import current_instances
from sharing_plugin.mig.layout import MigInstance
from sharing_plugin.mig.select import select_layouts
from sharing_plugin.plan.build import profile_resource_name
from sharing_plugin.views.dra_api import (
    Capacity,
    CounterSet,
    DeviceTaint,
    PublishedDevice,
    dns_label,
    memory_quantity,
)
from sharing_plugin.views.dra_attributes import GpuFacts, device_attributes, gpu_facts

COMPUTE_SLICES = "compute-slices"
MEDIA_EXTENSIONS = "media-extensions"
MIG_START = "migStart"  # the attribute holding a placement's first memory slice


def memory_slice(index: int) -> str:
    """The counter of one memory slice."""
    return f"memory-slice-{index}"


def gpu_counters(mig: MigModel) -> dict[str, int]:
    """The counters of a MIG-capable GPU with nothing on it."""
    counters = {memory_slice(i): 1 for i in range(mig.memory_slices)}
    counters[COMPUTE_SLICES] = mig.compute_slices
    if any(p.media_extensions for p in mig.profiles):
        counters[MEDIA_EXTENSIONS] = 1
    return counters


@lru_cache(maxsize=1024)
def consumption(spec: MigProfileSpec, start: int) -> dict[str, int]:
    """What an instance of `spec` at `start` takes of its GPU's counters (shared: not to be
    changed)."""
    used = {memory_slice(i): 1 for i in range(start, start + spec.memory_slices)}
    used[COMPUTE_SLICES] = spec.compute_slices
    if spec.media_extensions:
        used[MEDIA_EXTENSIONS] = 1
    return used


def counter_set_name(gpu_uuid: str) -> str:
    """The counter set of one GPU, a DNS label made of its UUID."""
    return dns_label(f"{gpu_uuid}-mig")


@lru_cache(maxsize=4096)
def placement_name(gpu_uuid: str, profile: str, start: int) -> str:
    """The device of one placement: `<gpu uuid>-<profile>-at-<start>` as a DNS label (`+` and
    `.` become `-`), stable for the same GPU and placement."""
    return dns_label(f"{gpu_uuid}-{profile}-at-{start}")


@dataclass(frozen=True, slots=True)
class PlacementRef:
    """Where a placement device's instance is: enough to find it again (at unprepare, after a
    restart, from what was published for the claim)."""

    gpu_uuid: str
    profile: str
    start: int

    def __str__(self) -> str:
        return f"{self.profile}@{self.start} on GPU {self.gpu_uuid}"


def published_placement(device: PublishedDevice) -> PlacementRef | None:
    """The placement a published device stands for; None for any other device."""
    start = device.attributes.get(MIG_START, {}).get("int")
    profile = device.attributes.get("migProfile", {}).get("string")
    gpu = device.attributes.get("uuid", {}).get("string")
    if isinstance(start, bool) or not isinstance(start, int):
        return None
    if not isinstance(profile, str) or not isinstance(gpu, str):
        return None
    return PlacementRef(gpu, profile, start)


@dataclass(frozen=True, slots=True)
class Placement:
    """One instance a dynamic GPU can have: a profile at a start, published as one device."""

    gpu: Gpu
    spec: MigProfileSpec
    start: int
    resource: str
    facts: GpuFacts

    @property
    def name(self) -> str:
        return placement_name(self.gpu.uuid, self.spec.name, self.start)

    @property
    def placement(self) -> MigPlacement:
        return MigPlacement(self.start, self.spec.memory_slices)

    def __str__(self) -> str:
        return f"{self.spec.name}@{self.start}"

    @property
    def ref(self) -> PlacementRef:
        return PlacementRef(self.gpu.uuid, self.spec.name, self.start)

    def published(
        self, *, consuming: bool = True, taint: DeviceTaint | None = None
    ) -> PublishedDevice:
        gpu = self.gpu
        return _published(
            gpu.uuid, self.facts, gpu.index, self.resource, self.spec, self.start, consuming, taint
        )


@lru_cache(maxsize=8192)
def _published(
    gpu_uuid: str,
    facts: GpuFacts,
    index: int,
    resource: str,
    spec: MigProfileSpec,
    start: int,
    consuming: bool,
    taint: DeviceTaint | None,
) -> PublishedDevice:
    """One placement's device (kept: the pool is computed again at every change, and a node
    has a few hundred placements that rarely change; shared, so never to be changed)."""
    attributes = device_attributes(
        resource=resource,
        uuid=gpu_uuid,
        facts=facts,
        sharing="none",
        index=index,
        mig_profile=spec.name,
        parent_uuid=gpu_uuid,
    )
    attributes[MIG_START] = {"int": start}
    return PublishedDevice(
        name=placement_name(gpu_uuid, spec.name, start),
        attributes=attributes,
        capacity={"memory": Capacity(memory_quantity(spec.memory_mib))},
        consumes={counter_set_name(gpu_uuid): consumption(spec, start)} if consuming else {},
        taints=(taint,) if taint is not None else (),
    )


@dataclass(frozen=True, slots=True)
class DynamicGpu:
    """A GPU of a dynamic entry: its placements (none while MIG mode is off) and the GPU
    instances on it now."""

    gpu: Gpu
    mig: MigModel | None
    placements: tuple[Placement, ...]
    instances: tuple[MigInstance, ...]

    @property
    def counter_set(self) -> str:
        return counter_set_name(self.gpu.uuid)

    def occupant(self, placement: Placement) -> MigInstance | None:
        """The instance at exactly that placement (the one a claim allocated it adopts)."""
        return next(
            (
                i
                for i in self.instances
                if i.profile == placement.spec.name and i.placement == placement.placement
            ),
            None,
        )


@dataclass(frozen=True, slots=True)
class DynamicPool:
    """The dynamic GPUs of a node and which GPU or MIG UUIDs are unhealthy."""

    gpus: tuple[DynamicGpu, ...] = ()
    unhealthy: frozenset[str] = frozenset()
    _by_name: dict[str, tuple[DynamicGpu, Placement]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        found = {p.name: (g, p) for g in self.gpus for p in g.placements}
        object.__setattr__(self, "_by_name", found)

    @property
    def gpu_uuids(self) -> frozenset[str]:
        """Every GPU of a dynamic entry: no other device of the pool may be on them."""
        return frozenset(g.gpu.uuid for g in self.gpus)

    def placement(self, name: str) -> Placement | None:
        found = self._by_name.get(name)
        return found[1] if found is not None else None

    def healthy(self, name: str) -> bool:
        found = self._by_name.get(name)
        if found is None:
            return False
        gpu, placement = found
        occupant = gpu.occupant(placement)
        return gpu.gpu.uuid not in self.unhealthy and (
            occupant is None or occupant.id not in self.unhealthy
        )

    def published(
        self,
        *,
        held: Collection[str] = (),
        taints: Mapping[str, DeviceTaint] | None = None,
    ) -> tuple[tuple[CounterSet, ...], tuple[PublishedDevice, ...]]:
        """The counter sets and devices to publish, given the device names prepared claims
        hold (see the module doc). An unhealthy placement leaves the pool unless a claim holds
        it or `taints` has its GPU's taint (GPU UUID -> taint), as `views.dra.pool_devices`
        treats the other devices."""
        held = set(held)
        sets: list[CounterSet] = []
        devices: list[PublishedDevice] = []
        for gpu in self.gpus:
            if gpu.mig is None or not gpu.placements:
                continue
            counters = gpu_counters(gpu.mig)
            adopted: set[str] = set()
            for instance in gpu.instances:
                placement = _placement_of(gpu, instance)
                if placement is not None and placement.name in held:
                    continue  # counted by the allocator: its claim is allocated the device
                if placement is not None:
                    adopted.add(placement.name)
                for counter, used in _instance_consumption(gpu.mig, instance).items():
                    counters[counter] = max(0, counters.get(counter, 0) - used)
            sets.append(CounterSet(gpu.counter_set, counters))
            taint = (taints or {}).get(gpu.gpu.uuid)
            for placement in gpu.placements:
                name = placement.name
                healthy = self.healthy(name)
                if not healthy and name not in held and taint is None:
                    continue
                devices.append(
                    placement.published(
                        consuming=name not in adopted,
                        taint=None if healthy or name in held else taint,
                    )
                )
        return tuple(sets), tuple(devices)


def _placement_of(gpu: DynamicGpu, instance: MigInstance) -> Placement | None:
    return next(
        (
            p
            for p in gpu.placements
            if p.spec.name == instance.profile and p.placement == instance.placement
        ),
        None,
    )


def _instance_consumption(mig: MigModel, instance: MigInstance) -> dict[str, int]:
    """What an existing instance takes: its profile's placement, or at least its memory slices
    for an instance whose profile the catalog does not know."""
    spec = mig.profile(instance.profile)
    if spec is not None and spec.memory_slices == instance.placement.size:
        return consumption(spec, instance.placement.start)
    return {memory_slice(i): 1 for i in range(instance.placement.start, instance.placement.end)}


def dynamic_pool(
    config: Config, inventory: Inventory, *, unhealthy: Iterable[str] = ()
) -> DynamicPool:
    """The GPUs `config` marks dynamic on this node, as they are in `inventory`.

    A GPU gets placements once its MIG mode is on and its model is catalogued (the pipeline's
    MIG step turns the mode on and reports a GPU it cannot: an uncatalogued or non-MIG GPU is
    refused there). Its other devices never reach the pool: the GPU is the partitioner's.
    """
    selected, _ = select_layouts(config.partitioning, inventory)
    gpus: list[DynamicGpu] = []
    for chosen in selected:
        if not chosen.layout.dynamic:
            continue
        gpu = chosen.gpu
        model = model_for(gpu.product)
        mig = model.mig if model is not None else None
        placements: tuple[Placement, ...] = ()
        if mig is not None and gpu.mig_enabled:
            facts = gpu_facts(gpu, inventory)
            placements = tuple(
                Placement(gpu, spec, start, profile_resource_name(config, spec.name), facts)
                for spec in mig.profiles
                for start in spec.starts
            )
        gpus.append(
            DynamicGpu(
                gpu=gpu,
                mig=mig,
                placements=placements,
                instances=current_instances(gpu) if gpu.mig_enabled else (),
            )
        )
    return DynamicPool(gpus=tuple(gpus), unhealthy=frozenset(unhealthy))


def placement_resources(pool: DynamicPool) -> set[str]:
    """The resource names the placements of `pool` are published under (one DeviceClass each)."""
    return {p.resource for g in pool.gpus for p in g.placements}
