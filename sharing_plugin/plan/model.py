"""The plan's values: what each resource advertises, and what a container is given.

A `Plan` is computed from a config and an inventory and never changes; health changes at run time
produce a new `Plan` through `with_health`, so the supervisor can diff two plans like any other
pair of values. Everything here is frozen; lookups that Allocate needs on every call are built
once per `ResourcePlan`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import NewType

from sharing_plugin.config.model import Enforcement, SharingKind
from sharing_plugin.gpus.inventory import GpuUuid
from sharing_plugin.plan.mps import MpsDaemon

DeviceId = NewType("DeviceId", str)
"""An ID kubelet sees: ``GPU-…``, ``MIG-…`` or ``<uuid>::<n>`` for replica n."""

REPLICA_SEPARATOR = "::"


def replica_id(physical: str, replica: int) -> DeviceId:
    """The advertised ID of replica `replica` of a physical device (the reference's format)."""
    return DeviceId(f"{physical}{REPLICA_SEPARATOR}{replica}")


def physical_of(device_id: str) -> str:
    """The physical UUID behind an advertised ID (the ID itself when it is not a replica)."""
    head, sep, _ = device_id.partition(REPLICA_SEPARATOR)
    return head if sep else device_id


class DeviceHealth(StrEnum):
    """The two health values of the kubelet device plugin API."""

    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"


@dataclass(frozen=True, slots=True)
class VirtualDevice:
    """One device kubelet can hand to a container: a whole GPU, a MIG device, or a replica."""

    id: DeviceId
    physical: str  # UUID of the GPU or MIG device behind it
    gpu_uuid: GpuUuid  # the physical GPU it lives on (itself for a whole GPU)
    index: str  # what deviceIDStrategy=index tells the container: "0" or "0:1"
    numa: int | None
    paths: tuple[str, ...]  # device nodes the container needs (passDeviceSpecs)
    healthy: bool = True
    discovered_healthy: bool = True  # False: the GPU did not answer NVML while being discovered
    replica: int | None = None  # None: not shared
    replicas: int = 1  # replicas of `physical` in this resource
    is_mig: bool = False
    compute_capability: tuple[int, int] = (0, 0)
    memory_cap_mib: int | None = None  # the driver's cap on this replica (memoryLimits on)

    @property
    def health(self) -> DeviceHealth:
        return DeviceHealth.HEALTHY if self.healthy else DeviceHealth.UNHEALTHY

    @property
    def shared(self) -> bool:
        return self.replica is not None


@dataclass(frozen=True, slots=True)
class ResourcePlan:
    """Everything one resource name advertises, in a deterministic order."""

    name: str
    devices: tuple[VirtualDevice, ...]
    sharing: SharingKind = SharingKind.NONE
    fail_requests_greater_than_one: bool = False
    _by_id: dict[str, VirtualDevice] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_id", {d.id: d for d in self.devices})

    def device(self, device_id: str) -> VirtualDevice | None:
        return self._by_id.get(device_id)

    def __contains__(self, device_id: object) -> bool:
        return device_id in self._by_id

    @property
    def ids(self) -> tuple[DeviceId, ...]:
        return tuple(d.id for d in self.devices)

    @property
    def healthy_count(self) -> int:
        return sum(1 for d in self.devices if d.healthy)

    def replicas_by_physical(self) -> dict[str, int]:
        """How many devices of this resource each physical device backs, in device order."""
        counts: dict[str, int] = {}
        for d in self.devices:
            counts[d.physical] = counts.get(d.physical, 0) + 1
        return counts

    def with_health(self, unhealthy: frozenset[str]) -> ResourcePlan:
        """This resource with every device on an unhealthy GPU or MIG device marked so."""
        devices = tuple(
            _with_flag(
                d,
                d.discovered_healthy
                and d.physical not in unhealthy
                and d.gpu_uuid not in unhealthy,
            )
            for d in self.devices
        )
        if devices == self.devices:
            return self
        return replace(self, devices=devices)


def _with_flag(device: VirtualDevice, healthy: bool) -> VirtualDevice:
    return device if device.healthy == healthy else replace(device, healthy=healthy)


@dataclass(frozen=True, slots=True)
class CapState:
    """One GPU: are its shares' caps enforced, and if not, why."""

    enforced: bool
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class MemoryLimitState:
    """`/status`'s `memoryLimits`: the mode and each GPU's state."""

    enforce: Enforcement
    gpus: Mapping[str, CapState]

    def document(self) -> dict[str, object]:
        return {
            "enforce": self.enforce.value,
            "gpus": {
                uuid: {"enforced": s.enforced, "reason": s.reason} for uuid, s in self.gpus.items()
            },
        }


@dataclass(frozen=True, slots=True)
class Plan:
    """What a config advertises on a node: resources sorted by name, and warnings for the admin."""

    resources: tuple[ResourcePlan, ...]
    warnings: tuple[str, ...] = ()
    mps: tuple[MpsDaemon, ...] = ()  # the MPS control daemon of each MPS resource
    memory_limits: MemoryLimitState | None = None  # None: memoryLimits off
    _by_name: dict[str, ResourcePlan] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {r.name: r for r in self.resources})

    def resource(self, name: str) -> ResourcePlan | None:
        return self._by_name.get(name)

    def with_health(self, health: Mapping[str, bool]) -> Plan:
        """The same plan with health applied: a `False` entry for a GPU UUID marks that GPU and
        every MIG device and replica on it unhealthy; for a MIG UUID, that MIG device only.
        Devices unhealthy at discovery stay unhealthy (they are not in the mapping's power)."""
        unhealthy = frozenset(uuid for uuid, ok in health.items() if not ok)
        return replace(self, resources=tuple(r.with_health(unhealthy) for r in self.resources))


# --- Allocate answers --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Mount:
    """A bind mount kubelet adds to the container (the API's `Mount`)."""

    container_path: str
    host_path: str
    read_only: bool = False


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    """A device node kubelet adds to the container (the API's `DeviceSpec`)."""

    container_path: str
    host_path: str
    permissions: str = "rw"


@dataclass(frozen=True, slots=True)
class ContainerAllocation:
    """The answer for one container of an Allocate call, in the API's terms."""

    envs: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    devices: tuple[DeviceSpec, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()  # fully qualified CDI names, e.g. "nvidia.com/gpu=GPU-…"
    physical: tuple[str, ...] = ()  # unique physical UUIDs granted, in request order
    note: str | None = None  # what the admin should hear once (e.g. one cap for two GPUs)


def unique(items: Iterable[str]) -> list[str]:
    """`items` without repeats, first occurrence kept (request order matters to CUDA)."""
    return list(dict.fromkeys(items))
