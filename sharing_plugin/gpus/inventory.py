"""What the rest of the plugin knows about the node's GPUs: plain frozen values, no I/O.

The NVML adapter (or the simulator beneath it) builds an `Inventory`; the plan, the MIG solver
and the kubelet adapter only read it. Health is not part of the inventory: it changes at run
time and travels separately, keyed by device UUID.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import IntEnum
from typing import NewType

GpuUuid = NewType("GpuUuid", str)
"""A whole GPU's UUID as NVML reports it: ``GPU-xxxxxxxx-xxxx-...``."""

MigUuid = NewType("MigUuid", str)
"""A MIG device's UUID as NVML reports it: ``MIG-xxxxxxxx-xxxx-...``."""


_BDF = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]")


def extended_bdf(nvml_bus_id: str) -> str | None:
    """NVML's bus ID (`00000000:07:00.0`: an 8-digit domain, upper case) in the extended BDF
    notation of sysfs and Kubernetes' standard attributes (`0000:07:00.0`); None for neither."""
    text = nvml_bus_id.strip().lower()
    if len(text) == 16 and text.startswith("0000"):
        text = text[4:]
    return text if _BDF.fullmatch(text) else None


class Topology(IntEnum):
    """How two GPUs are connected over PCIe, NVML's nvmlGpuTopologyLevel_t (lower is closer)."""

    INTERNAL = 0  # the same board (multi-GPU boards)
    SINGLE = 10  # one PCIe switch between them
    MULTIPLE = 20  # several PCIe switches, no host bridge
    HOSTBRIDGE = 30  # the same host bridge
    NODE = 40  # the same NUMA node
    SYSTEM = 50  # across NUMA nodes (SMP interconnect)


@dataclass(frozen=True, slots=True)
class MigPlacement:
    """Where a GPU instance sits, in memory slices: NVML's nvmlGpuInstancePlacement_t."""

    start: int
    size: int

    @property
    def end(self) -> int:
        return self.start + self.size

    def overlaps(self, other: MigPlacement) -> bool:
        return self.start < other.end and other.start < self.end


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG device (a GPU instance with one compute instance spanning it)."""

    uuid: MigUuid
    parent_uuid: GpuUuid
    parent_index: int
    index: int  # the MIG device handle index on its parent (nvmlDeviceGetMigDeviceHandleByIndex)
    gi_id: int
    ci_id: int
    profile: str  # canonical profile name, e.g. "1g.10gb" or "1g.10gb+me"
    gi_profile_id: int  # NVML_GPU_INSTANCE_PROFILE_* value
    placement: MigPlacement
    memory_mib: int
    sm_count: int = 0


@dataclass(frozen=True, slots=True)
class Gpu:
    """One physical GPU as NVML reports it."""

    index: int
    uuid: GpuUuid
    product: str  # nvmlDeviceGetName, e.g. "NVIDIA A100-SXM4-80GB"
    memory_mib: int
    minor: int  # /dev/nvidia<minor>
    pci_bus_id: str
    numa_node: int | None
    compute_capability: tuple[int, int]
    mig_capable: bool = False
    mig_enabled: bool = False  # current MIG mode
    mig_pending: bool = False  # pending MIG mode (takes effect after a GPU reset)
    mig_devices: tuple[MigDevice, ...] = ()
    healthy_at_discovery: bool = True  # False when the GPU did not answer while being discovered
    problem: str | None = None  # why it is unhealthy at discovery, in NVML's words
    architecture: str = ""  # e.g. "Hopper", as NVIDIA's tools name nvmlDeviceGetArchitecture
    brand: str = ""  # e.g. "Nvidia", "Tesla": nvmlDeviceGetBrand as NVIDIA's tools name it
    pcie_root: str | None = None  # the PCIe root complex, `pci<domain>:<bus>`, from sysfs


@dataclass(frozen=True, slots=True)
class GpuLink:
    """How the GPUs with indexes `a` < `b` are connected."""

    a: int
    b: int
    nvlinks: int  # number of NVLink links between the two (0: none)
    topology: Topology


@dataclass(frozen=True, slots=True)
class Inventory:
    """Every GPU of the node, with its MIG devices and the links between GPUs."""

    gpus: tuple[Gpu, ...]
    links: tuple[GpuLink, ...] = ()
    driver_version: str = ""
    cuda_driver_version: int = 0
    warnings: tuple[str, ...] = ()
    _by_uuid: dict[str, Gpu] = field(init=False, repr=False, compare=False)
    _mig_by_uuid: dict[str, MigDevice] = field(init=False, repr=False, compare=False)
    _links: dict[tuple[int, int], GpuLink] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_uuid", {g.uuid: g for g in self.gpus})
        object.__setattr__(
            self, "_mig_by_uuid", {m.uuid: m for g in self.gpus for m in g.mig_devices}
        )
        object.__setattr__(self, "_links", {(link.a, link.b): link for link in self.links})

    def gpu(self, uuid: str) -> Gpu | None:
        return self._by_uuid.get(uuid)

    def mig_device(self, uuid: str) -> MigDevice | None:
        return self._mig_by_uuid.get(uuid)

    def link(self, a: int, b: int) -> GpuLink | None:
        """The link between two GPU indexes, in either order; None for a == b or unknown."""
        return self._links.get((min(a, b), max(a, b)))
