"""The config model: the reference plugin's v1 format, plus our extensions, as pydantic values.

Everything is resolved here, once: defaults filled, resource names normalised to
``nvidia.com/<name>``, device selections parsed into typed references. Later code never checks
for ``None`` or re-parses strings. Models are frozen; keys are camelCase as the reference writes
them, and unknown keys are errors.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

DEFAULT_IGNORED_XIDS: tuple[int, ...] = (13, 31, 43, 45, 68, 109)
MAX_DEVICES_PER_RESOURCE = 60_000  # kubelet's 4 MiB ListAndWatch limit at ~59 bytes per device


class Strict(BaseModel):
    """Base of every config section: frozen, camelCase keys, unknown keys rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
    )


class MigStrategy(StrEnum):
    NONE = "none"
    SINGLE = "single"
    MIXED = "mixed"


class DeviceListStrategy(StrEnum):
    ENVVAR = "envvar"
    VOLUME_MOUNTS = "volume-mounts"
    CDI_ANNOTATIONS = "cdi-annotations"
    CDI_CRI = "cdi-cri"


class DeviceIdStrategy(StrEnum):
    UUID = "uuid"
    INDEX = "index"


class AllocationPolicy(StrEnum):
    DISTRIBUTED = "distributed"
    PACKED = "packed"


class SharingKind(StrEnum):
    NONE = "none"
    TIME_SLICING = "time-slicing"
    MPS = "mps"


# --- device references inside `devices:` lists -------------------------------------------------


@dataclass(frozen=True, slots=True)
class GpuIndexRef:
    """`0` or `"0"`: the GPU with that NVML index."""

    index: int


@dataclass(frozen=True, slots=True)
class MigIndexRef:
    """`"0:1"`: MIG device 1 of GPU 0."""

    gpu: int
    mig: int


@dataclass(frozen=True, slots=True)
class UuidRef:
    """`GPU-<uuid>` or `MIG-<uuid>`."""

    uuid: str


@dataclass(frozen=True, slots=True)
class MigGiCiRef:
    """`MIG-GPU-<uuid>/<gi>/<ci>`: the old-style MIG device name."""

    gpu_uuid: str
    gi: int
    ci: int


@dataclass(frozen=True, slots=True)
class ProductRef:
    """`{product: <glob>}`: every GPU whose NVML name matches (our extension)."""

    product: str


DeviceRef = GpuIndexRef | MigIndexRef | UuidRef | MigGiCiRef | ProductRef

DeviceSelection = Literal["all"] | int | tuple[DeviceRef, ...]
"""`all`, a count of devices (the first N), or an explicit list of references."""


# --- sections ------------------------------------------------------------------------------------


class PluginFlags(Strict):
    pass_device_specs: bool = False
    device_list_strategy: tuple[DeviceListStrategy, ...] = (DeviceListStrategy.ENVVAR,)
    device_id_strategy: DeviceIdStrategy = DeviceIdStrategy.UUID
    cdi_annotation_prefix: str = "cdi.k8s.io/"
    nvidia_ctk_path: str = "/usr/bin/nvidia-ctk"
    container_driver_root: str = "/driver-root"
    shared_devices_allocation_policy: AllocationPolicy = AllocationPolicy.DISTRIBUTED


class GfdFlags(Strict):
    oneshot: bool | None = None
    no_timestamp: bool | None = None
    sleep_interval: str | None = None
    output_file: str | None = None
    machine_type_file: str | None = None


class Flags(Strict):
    mig_strategy: MigStrategy = MigStrategy.NONE
    fail_on_init_error: bool = True
    nvidia_driver_root: str = "/"
    nvidia_dev_root: str = "/"
    mps_root: str = "/run/nvidia/mps"
    gdrcopy_enabled: bool | None = None
    gds_enabled: bool | None = None
    mofed_enabled: bool | None = None
    plugin: PluginFlags = PluginFlags()
    gfd: GfdFlags | None = None


class ResourcePattern(Strict):
    """`{pattern, name}`: devices whose product (or MIG profile) matches are advertised as name."""

    pattern: str
    name: str  # normalised to a full extended resource name


class Resources(Strict):
    gpus: tuple[ResourcePattern, ...] = ()
    mig: tuple[ResourcePattern, ...] = ()


class ReplicatedResource(Strict):
    name: str  # the resource being shared, normalised (e.g. nvidia.com/gpu)
    rename: str | None = None  # normalised; None keeps `name` (or `<name>.shared`, see below)
    devices: DeviceSelection = "all"
    replicas: int = Field(ge=1, le=MAX_DEVICES_PER_RESOURCE)


class Sharing(Strict):
    """`sharing.timeSlicing` or `sharing.mps`."""

    rename_by_default: bool = False
    fail_requests_greater_than_one: bool = False
    resources: tuple[ReplicatedResource, ...]


class SharingSection(Strict):
    time_slicing: Sharing | None = None
    mps: Sharing | None = None

    @property
    def kind(self) -> SharingKind:
        if self.mps is not None:
            return SharingKind.MPS
        if self.time_slicing is not None:
            return SharingKind.TIME_SLICING
        return SharingKind.NONE

    @property
    def active(self) -> Sharing | None:
        return self.mps or self.time_slicing


class Health(Strict):
    enabled: bool = True
    ignored_xids: tuple[int, ...] = DEFAULT_IGNORED_XIDS


class MigLayout(Strict):
    """One `partitioning.mig` entry: the MIG layout wanted on the selected GPUs."""

    devices: DeviceSelection = "all"
    enabled: bool = True
    profiles: dict[str, int] = Field(default_factory=dict)


class Partitioning(Strict):
    mig: tuple[MigLayout, ...] = ()


class Config(Strict):
    """A whole config: one named entry of the ConfigMap, or one file."""

    version: Literal["v1"] = "v1"
    flags: Flags = Flags()
    resources: Resources = Resources()
    sharing: SharingSection = SharingSection()
    health: Health = Health()
    partitioning: Partitioning | None = None  # None: never touch MIG
