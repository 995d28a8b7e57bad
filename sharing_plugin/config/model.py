"""The config model: the reference plugin's v1 format, plus our extensions, as pydantic values.

A config is resolved once, at load: defaults filled, resource names normalised to
``nvidia.com/<name>``, device selections parsed into typed references, the reference's other
spellings folded into ours. Later code never checks for ``None`` or re-parses strings. Defined
here: the sections that say what is advertised and how it is shared or partitioned, and the
whole `Config`. The base model, enums and run-time option sections are defined beside it and
re-exported, so the model is imported from one place.

A section here checks its own fields only. Rules between values (entries that overlap, two
sharing modes, sizes given twice) read the built model and report issues beside the field
errors: the model does not know them, so imports run one way, from the rules to the model.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    PlainValidator,
    SerializerFunctionWrapHandler,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    WithJsonSchema,
    field_validator,
    model_serializer,
)
from pydantic_core import PydanticCustomError

from sharing_plugin.config.base import (
    DEFAULT_IGNORED_XIDS,
    MAX_DEVICES_PER_RESOURCE,
    MIG_PROFILE_PATTERN,
    AllocationPolicy,
    DeviceDiscoveryStrategy,
    DeviceIdStrategy,
    DeviceListStrategy,
    Devices,
    EventType,
    MigStrategy,
    ResourceName,
    SharedDevices,
    SharingKind,
    Strict,
    strict_str,
)
from sharing_plugin.config.compat import TimeSlicingStrategy
from sharing_plugin.config.devices import (
    DeviceRef,
    DeviceSelection,
    GpuIndexRef,
    MigGiCiRef,
    MigIndexRef,
    ProductRef,
    UuidRef,
)
from sharing_plugin.config.memory import Enforcement, MemoryLimits
from sharing_plugin.config.names import check_pattern
from sharing_plugin.config.options import Flags, GfdFlags, Health, Imex, PluginFlags
from sharing_plugin.config.quantity import MemoryMiB
from sharing_plugin.config.usage import Usage

__all__ = [
    "DEFAULT_IGNORED_XIDS",
    "MAX_DEVICES_PER_RESOURCE",
    "AllocationPolicy",
    "Config",
    "DeviceDiscoveryStrategy",
    "DeviceIdStrategy",
    "DeviceListStrategy",
    "DeviceRef",
    "DeviceSelection",
    "Dra",
    "Enforcement",
    "EventType",
    "Flags",
    "GfdFlags",
    "GpuIndexRef",
    "Health",
    "Imex",
    "MemoryLimits",
    "MigGiCiRef",
    "MigIndexRef",
    "MigLayout",
    "MigStrategy",
    "MpsResource",
    "MpsSharing",
    "Partitioning",
    "PluginFlags",
    "ProductRef",
    "ReplicatedResource",
    "ResourcePattern",
    "Resources",
    "SharedDevices",
    "Sharing",
    "SharingKind",
    "SharingSection",
    "Usage",
    "UuidRef",
]


class ResourcePattern(Strict):
    """`{pattern, name}`: devices whose product (or MIG profile) matches are advertised as name."""

    pattern: Annotated[
        StrictStr,
        PlainValidator(lambda v: check_pattern(strict_str(v))),
        WithJsonSchema({"type": "string", "minLength": 1, "pattern": r"^[^?\[\]]*$"}),
    ]
    """Glob (only `*`) matched against the whole product name or MIG profile."""
    name: ResourceName
    """Resource name to advertise matching devices under."""


class Resources(Strict):
    """Which resource name each kind of device is advertised under."""

    gpus: tuple[ResourcePattern, ...] = ()
    """Full GPUs, matched by the product name NVML reports."""
    mig: tuple[ResourcePattern, ...] = ()
    """MIG devices, matched by profile (e.g. 1g.10gb)."""


def _sized_by_replicas_or_memory(schema: dict[str, Any]) -> None:
    schema["oneOf"] = [{"required": ["replicas"]}, {"required": ["memoryPerReplica"]}]


def _replicas_schema(schema: dict[str, Any]) -> None:
    schema.pop("default", None)  # unset stands for "sized by memoryPerReplica"
    schema["minimum"] = 1


class ReplicatedResource(Strict):
    """One shared resource: which devices, how many replicas each, under which name."""

    model_config = ConfigDict(json_schema_extra=_sized_by_replicas_or_memory)

    name: ResourceName
    """The resource being shared (e.g. gpu or nvidia.com/mig-1g.10gb)."""
    rename: ResourceName | None = None
    """Advertise the replicas under this name instead."""
    devices: Devices = "all"
    # 0 while unset (defaults are not validated): the replicas of each device then come from
    # memoryPerReplica, at plan time.
    replicas: StrictInt = Field(
        default=0, ge=1, le=MAX_DEVICES_PER_RESOURCE, json_schema_extra=_replicas_schema
    )
    """Virtual devices per selected device (1 means not shared); or set memoryPerReplica."""
    memory_per_replica: MemoryMiB | None = None
    """GPU memory per replica instead of replicas (e.g. 10Gi): each device gets as many replicas
    as its memory holds; with memoryLimits on, each replica's memory cap."""

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if self.memory_per_replica is not None:
            data.pop("replicas", None)
        return data


class MpsResource(ReplicatedResource):
    """One `sharing.mps.resources` entry: clients per GPU and the limits the MPS daemon sets."""

    replicas: StrictInt = Field(
        default=0, ge=0, le=MAX_DEVICES_PER_RESOURCE, json_schema_extra=_replicas_schema
    )
    """Clients (virtual devices) per selected GPU; or set memoryPerReplica instead."""

    active_thread_percentage: StrictInt | None = Field(default=None, ge=1, le=100)
    """Percent of a GPU's threads each client may use (default: 100 / replicas)."""
    pinned_memory_limit: MemoryMiB | None = None
    """GPU memory each client may pin (e.g. 10Gi; default: GPU memory / replicas)."""
    oversubscribe: (
        Annotated[
            StrictFloat | StrictInt,
            Field(ge=1, le=16),
            WithJsonSchema({"type": "number", "minimum": 1, "maximum": 16}),
        ]
        | None
    ) = None
    """Let the clients' memory limits on a GPU add up to this many times its memory (e.g.
    1.5); a warning says where they do."""


class Sharing(Strict):
    """`sharing.timeSlicing` or `sharing.mps`."""

    strategy: TimeSlicingStrategy = None
    """The reference's time-slicing strategy: only "" (no effect); see
    flags.plugin.sharedDevicesAllocationPolicy."""

    rename_by_default: StrictBool = False
    """Advertise shared resources as `<name>.shared` unless an entry sets `rename`."""
    fail_requests_greater_than_one: StrictBool = False
    """Refuse containers that request more than one replica of a shared resource."""
    # The check below words the error; the schema says the same to editors.
    resources: tuple[ReplicatedResource, ...] = Field(json_schema_extra={"minItems": 1})
    """The resources to share; at least one."""

    @field_validator("resources", mode="after")
    @classmethod
    def _not_empty(cls, value: tuple[ReplicatedResource, ...]) -> tuple[ReplicatedResource, ...]:
        if not value:
            raise PydanticCustomError(
                "empty_resources",
                "{detail}",
                {
                    "detail": "no resources to share: list at least one "
                    "(e.g. {name: gpu, replicas: 4}) or remove this section"
                },
            )
        return value


class MpsSharing(Sharing):
    """`sharing.mps`: like time-slicing, but over-sized requests are refused by default."""

    fail_requests_greater_than_one: StrictBool = True
    """Refuse containers that request more than one replica (MPS default: true)."""
    resources: tuple[MpsResource, ...] = Field(json_schema_extra={"minItems": 1})
    """The resources to share, each with its own MPS control daemon; at least one."""
    multi_user: StrictBool = False
    """Start each control daemon in multi-user mode (`nvidia-cuda-mps-control -d -M`), so
    containers running as different UIDs share it; its pipe directory is then open to every
    UID (default: one UID per daemon at a time, MPS's own default)."""


class SharingSection(Strict):
    """How devices are shared: by time-slicing or by MPS, never both."""

    time_slicing: Sharing | None = None
    """Share by time-slicing: each selected device advertised as several replicas."""
    mps: MpsSharing | None = None
    """Share through an MPS control daemon, with per-client memory and thread limits."""

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


class MigLayout(Strict):
    """One `partitioning.mig` entry: the MIG layout wanted on the selected GPUs."""

    devices: Devices = "all"
    enabled: StrictBool = True
    """Whether MIG mode is on for these GPUs."""
    profiles: dict[
        Annotated[StrictStr, Field(pattern=MIG_PROFILE_PATTERN)],
        Annotated[StrictInt, Field(ge=1, le=7)],
    ] = Field(default_factory=dict)
    """MIG profile -> how many instances of it (e.g. {1g.10gb: 2, 2g.20gb: 1})."""
    dynamic: StrictBool = False
    """`run-dra` only: every MIG placement of these GPUs is published as a partitionable
    device, and the instance a claim is allocated is created when it is prepared (no
    `profiles`); `run` refuses such an entry."""


class Partitioning(Strict):
    """Declared device layouts, applied by the plugin."""

    mig: tuple[MigLayout, ...] = ()
    """MIG layouts; entries must select disjoint GPUs."""


class Dra(Strict):
    """`run-dra` only (Dynamic Resource Allocation); the device plugin (`run`) ignores it."""

    shared_devices: SharedDevices = SharedDevices.CAPACITY
    """A time-slicing or MPS GPU as one device whose memory claims consume (capacity: a claim
    that asks nothing takes one replica's share), or as one device per replica (replicas)."""


class Config(Strict):
    """A whole config: one named entry of the ConfigMap, or one file."""

    version: Literal["v1"] = "v1"
    """Config format version; only v1."""
    flags: Flags = Flags()
    """Options shared with the reference plugin's command line (MIG strategy, driver roots,
    how containers are told their devices)."""
    resources: Resources = Resources()
    """Which resource name each kind of device is advertised under (by product or profile)."""
    sharing: SharingSection = SharingSection()
    """How devices are shared: time-slicing or MPS; absent: each device advertised once."""
    health: Health = Health()
    """GPU health checking through NVML Xid events, and recovery."""
    partitioning: Partitioning | None = None
    """Declared MIG layouts; absent: the plugin never changes MIG."""
    imex: Imex | None = None
    """IMEX channels: accepted for compatibility; has no effect here."""
    dra: Dra = Dra()
    """How `run-dra` publishes the devices (Dynamic Resource Allocation); `run` ignores it."""
    usage: Usage = Usage()
    """Per-pod GPU usage on shared GPUs: when a pod counts as over its memory share."""
    memory_limits: MemoryLimits = MemoryLimits()
    """Whether each share's GPU memory is capped by the driver (off by default)."""
