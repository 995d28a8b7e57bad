"""The config model: the reference plugin's v1 format, plus our extensions, as pydantic values.

Everything is resolved here, once: defaults filled, resource names normalised to
``nvidia.com/<name>``, device selections parsed into typed references. Later code never checks
for ``None`` or re-parses strings. Models are frozen; keys are camelCase as the reference writes
them, and unknown keys are errors. Scalars are strict (`"true"` is not a bool, `2.0` is not an
int) because the reference's Go decoder refuses those too. Rules that span fields are checked in
one place per section and reported together, each with the path it is about.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from sharing_plugin.config import rules
from sharing_plugin.config.devices import (
    DEVICES_JSON_SCHEMA,
    DeviceRef,
    DeviceSelection,
    GpuIndexRef,
    MigGiCiRef,
    MigIndexRef,
    ProductRef,
    UuidRef,
    dump_devices,
    parse_devices,
)
from sharing_plugin.config.names import (
    RESOURCE_NAME_PATTERN,
    check_pattern,
    normalise_resource_name,
)

__all__ = [
    "DEFAULT_IGNORED_XIDS",
    "MAX_DEVICES_PER_RESOURCE",
    "AllocationPolicy",
    "Config",
    "DeviceIdStrategy",
    "DeviceListStrategy",
    "DeviceRef",
    "DeviceSelection",
    "EventType",
    "Flags",
    "GfdFlags",
    "GpuIndexRef",
    "Health",
    "Imex",
    "MigGiCiRef",
    "MigIndexRef",
    "MigLayout",
    "MigStrategy",
    "Partitioning",
    "PluginFlags",
    "ProductRef",
    "ReplicatedResource",
    "ResourcePattern",
    "Resources",
    "Sharing",
    "SharingKind",
    "SharingSection",
    "UuidRef",
]

DEFAULT_IGNORED_XIDS: tuple[int, ...] = (13, 31, 43, 45, 68, 109)
MAX_DEVICES_PER_RESOURCE = 60_000  # kubelet's 4 MiB ListAndWatch limit at ~59 bytes per device
MIG_PROFILE_PATTERN = r"^[1-8]g\.[0-9]+gb(\+[a-z]+)*$"
# Go's time.ParseDuration grammar (the reference decodes gfd.sleepInterval with it).
GO_DURATION_PATTERN = r"^[-+]?(0|(([0-9]+\.?[0-9]*|\.[0-9]+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h))+)$"


class Strict(BaseModel):
    """Base of every config section: frozen, camelCase keys, unknown keys rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
        field_title_generator=lambda name, info: info.alias or to_camel(name),
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


class DeviceDiscoveryStrategy(StrEnum):
    AUTO = "auto"
    NVML = "nvml"
    TEGRA = "tegra"


class EventType(StrEnum):
    """NVML event types the reference plugin's `health.eventTypes` may list."""

    XID_CRITICAL_ERROR = "EventTypeXidCriticalError"
    DOUBLE_BIT_ECC_ERROR = "EventTypeDoubleBitEccError"
    SINGLE_BIT_ECC_ERROR = "EventTypeSingleBitEccError"


class SharingKind(StrEnum):
    NONE = "none"
    TIME_SLICING = "time-slicing"
    MPS = "mps"


ResourceName = Annotated[
    StrictStr,
    PlainValidator(lambda v: normalise_resource_name(_strict_str(v))),
    WithJsonSchema(
        {
            "type": "string",
            "pattern": RESOURCE_NAME_PATTERN,
            "description": "An extended resource name; without '/' it gets 'nvidia.com/'.",
        }
    ),
]

Devices = Annotated[
    DeviceSelection,
    PlainValidator(parse_devices),
    PlainSerializer(dump_devices),
    WithJsonSchema(DEVICES_JSON_SCHEMA),
]


def _strict_str(value: Any) -> str:
    if not isinstance(value, str):
        raise PydanticCustomError("string_type", "Input should be a valid string")
    return value


def _one_or_many(value: Any) -> Any:
    # The reference accepts `deviceListStrategy: envvar` as well as a list of strategies.
    return [value] if isinstance(value, str) else value


def _empty_is_auto(value: Any) -> Any:
    # The reference treats an empty deviceDiscoveryStrategy like "auto".
    return "auto" if value == "" else value


def _go_duration(value: Any) -> Any:
    # The reference decodes a duration from a Go duration string ("60s", "1m30s") or a
    # number of nanoseconds.
    if isinstance(value, str) and not re.fullmatch(GO_DURATION_PATTERN, value):
        raise PydanticCustomError(
            "go_duration",
            "'{value}' is not a duration: write it like 60s, 5m or 1h30m",
            {"value": value},
        )
    return value


def _all_or_xids(value: Any) -> Any:
    # criticalXIDs: "all" (any case, as the reference reads it) means every Xid: the same as
    # leaving it out, so it is stored as None.
    if isinstance(value, str):
        if value.lower() == "all":
            return None
        raise PydanticCustomError(
            "critical_xids",
            "invalid string value for criticalXIDs: {value}; write all or a list of Xid numbers",
            {"value": value},
        )
    return value


def _time_slicing_strategy(value: Any) -> Any:
    if value != "":
        raise PydanticCustomError(
            "time_slicing_strategy",
            'unknown time-slicing strategy: {value}; the reference plugin accepts only "" '
            "here; to spread replicas over GPUs or fill one GPU first, set "
            "flags.plugin.sharedDevicesAllocationPolicy: distributed or packed",
            {"value": value},
        )
    return value


# --- sections ------------------------------------------------------------------------------------


class PluginFlags(Strict):
    """Options of the device plugin itself (`flags.plugin`)."""

    pass_device_specs: StrictBool = False
    """Also answer Allocate with device nodes (needed with the CPU manager)."""
    device_list_strategy: Annotated[
        tuple[DeviceListStrategy, ...], BeforeValidator(_one_or_many), Field(min_length=1)
    ] = (DeviceListStrategy.ENVVAR,)
    """How containers are told their devices: one strategy or a list of them."""
    device_id_strategy: DeviceIdStrategy = Field(DeviceIdStrategy.UUID, alias="deviceIDStrategy")
    """Tell containers GPU UUIDs or indices (advertised IDs are always UUID based)."""
    cdi_annotation_prefix: StrictStr = "cdi.k8s.io/"
    """Prefix of the CDI annotations (cdi-annotations strategy)."""
    nvidia_ctk_path: StrictStr | None = Field(None, alias="nvidiaCTKPath")
    """Accepted for compatibility; has no effect here."""
    container_driver_root: StrictStr = "/driver-root"
    """Where the driver root is mounted inside the plugin container."""
    shared_devices_allocation_policy: AllocationPolicy = AllocationPolicy.DISTRIBUTED
    """How replicas are picked: spread over GPUs (distributed) or fill one GPU first (packed)."""
    kubelet_socket: StrictStr | None = None
    """Accepted for compatibility; has no effect here (use --kubelet-dir)."""
    cdi_feature_flags: StrictStr | None = Field(None, alias="cdiFeatureFlags")
    """Accepted for compatibility; has no effect here."""


class GfdFlags(Strict):
    """Options of gpu-feature-discovery; accepted for compatibility, no effect here."""

    oneshot: StrictBool | None = None
    no_timestamp: StrictBool | None = None
    sleep_interval: Annotated[
        StrictStr | StrictInt | StrictFloat | None,
        BeforeValidator(_go_duration),
        WithJsonSchema(
            {
                "anyOf": [
                    {"type": "string", "pattern": GO_DURATION_PATTERN},
                    {"type": "number"},
                ],
                "description": "A Go duration (60s, 5m) or a number of nanoseconds.",
            }
        ),
    ] = None
    output_file: StrictStr | None = None
    machine_type_file: StrictStr | None = None


class Flags(Strict):
    """Options shared with the reference plugin's command line."""

    mig_strategy: MigStrategy = MigStrategy.NONE
    """How MIG devices are advertised: none, single (as nvidia.com/gpu) or mixed (per profile)."""
    fail_on_init_error: StrictBool = True
    """Exit when GPUs cannot be initialised (false: log and wait)."""
    nvidia_driver_root: StrictStr = "/"
    """Root of the NVIDIA driver installation on the host."""
    nvidia_dev_root: StrictStr = "/"
    """Root under which the NVIDIA device nodes live on the host (default: nvidiaDriverRoot)."""
    mps_root: StrictStr = "/run/nvidia/mps"
    """Host directory for the MPS control daemon's pipes and logs."""
    restart_on_device_unhealthy: StrictBool | None = None
    """Accepted for compatibility; has no effect here (unhealthy devices are reported)."""
    gdrcopy_enabled: StrictBool | None = None
    """Accepted for compatibility; has no effect here."""
    gds_enabled: StrictBool | None = None
    """Accepted for compatibility; has no effect here."""
    mofed_enabled: StrictBool | None = None
    """Accepted for compatibility; has no effect here."""
    use_node_feature_api: StrictBool | None = Field(None, alias="useNodeFeatureAPI")
    """Accepted for compatibility; has no effect here."""
    device_discovery_strategy: Annotated[
        DeviceDiscoveryStrategy | None, BeforeValidator(_empty_is_auto)
    ] = None
    """Accepted for compatibility; has no effect here (devices are found through NVML)."""
    plugin: PluginFlags = PluginFlags()
    gfd: GfdFlags | None = None
    """gpu-feature-discovery options: accepted for compatibility; no effect here."""

    @model_validator(mode="before")
    @classmethod
    def _dev_root_follows_driver_root(cls, data: Any) -> Any:
        # As in the reference: device nodes live under the driver root unless told otherwise.
        if isinstance(data, dict) and not {"nvidiaDevRoot", "nvidia_dev_root"} & data.keys():
            root = data.get("nvidiaDriverRoot", data.get("nvidia_driver_root"))
            if isinstance(root, str):
                return {**data, "nvidiaDevRoot": root}
        return data


class ResourcePattern(Strict):
    """`{pattern, name}`: devices whose product (or MIG profile) matches are advertised as name."""

    pattern: Annotated[StrictStr, PlainValidator(lambda v: check_pattern(_strict_str(v)))]
    """Glob (only `*`) matched against the whole product name or MIG profile."""
    name: ResourceName
    """Resource name to advertise matching devices under."""


class Resources(Strict):
    """Which resource name each kind of device is advertised under."""

    gpus: tuple[ResourcePattern, ...] = ()
    """Full GPUs, matched by the product name NVML reports."""
    mig: tuple[ResourcePattern, ...] = ()
    """MIG devices, matched by profile (e.g. 1g.10gb)."""


class ReplicatedResource(Strict):
    """One shared resource: which devices, how many replicas each, under which name."""

    name: ResourceName
    """The resource being shared (e.g. gpu or nvidia.com/mig-1g.10gb)."""
    rename: ResourceName | None = None
    """Advertise the replicas under this name instead."""
    devices: Devices = "all"
    replicas: StrictInt = Field(ge=1, le=MAX_DEVICES_PER_RESOURCE)
    """Virtual devices per selected device (1 means not shared)."""


class Sharing(Strict):
    """`sharing.timeSlicing` or `sharing.mps`."""

    strategy: Annotated[
        Literal[""] | None,
        BeforeValidator(_time_slicing_strategy),
        WithJsonSchema({"const": "", "description": "Accepted for compatibility; no effect."}),
    ] = None
    """The reference's time-slicing strategy: only "" (no effect); see
    flags.plugin.sharedDevicesAllocationPolicy."""

    rename_by_default: StrictBool = False
    """Advertise shared resources as `<name>.shared` unless an entry sets `rename`."""
    fail_requests_greater_than_one: StrictBool = False
    """Refuse containers that request more than one replica of a shared resource."""
    resources: tuple[ReplicatedResource, ...]
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

    @model_validator(mode="after")
    def _entries(self) -> Sharing:
        rules.raise_issues(rules.sharing_issues(self))
        return self


class MpsSharing(Sharing):
    """`sharing.mps`: like time-slicing, but over-sized requests are refused by default."""

    fail_requests_greater_than_one: StrictBool = True
    """Refuse containers that request more than one replica (MPS default: true)."""


class SharingSection(Strict):
    """How devices are shared: by time-slicing or by MPS, never both."""

    time_slicing: Sharing | None = None
    mps: MpsSharing | None = None

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

    @model_validator(mode="after")
    def _one_mode(self) -> SharingSection:
        if self.time_slicing is not None and self.mps is not None:
            rules.raise_issues(
                [
                    rules.Issue(
                        ("mps",),
                        "timeSlicing and mps cannot both be set: a GPU is shared one way; "
                        "keep one of the two sections",
                    )
                ]
            )
        return self


Xid = Annotated[StrictInt, Field(ge=0)]


class Health(Strict):
    """GPU health checking through NVML Xid events.

    Our keys (`enabled`, `ignoredXids`) and the reference's newer ones (`disabled`,
    `ignoredXIDs`, `criticalXIDs`, `eventTypes`) are both accepted and resolved here, once:
    afterwards `enabled`, `ignored_xids` and `critical_xids` say everything, and `disabled`
    and `ignored_xids_reference` are always None.
    """

    enabled: StrictBool = True
    """Watch Xid events and mark affected devices Unhealthy."""
    ignored_xids: tuple[Xid, ...] = DEFAULT_IGNORED_XIDS
    """Xids that are application errors, not GPU faults."""
    critical_xids: Annotated[
        tuple[Xid, ...] | None,
        BeforeValidator(_all_or_xids),
        WithJsonSchema(
            {
                "anyOf": [
                    {"type": "string", "pattern": "^[Aa][Ll][Ll]$"},
                    {"type": "array", "items": {"type": "integer", "minimum": 0}},
                ],
                "description": "all (default): every Xid not ignored marks a GPU Unhealthy; "
                "a list: only these do (ignored Xids never do).",
            }
        ),
    ] = Field(None, alias="criticalXIDs")
    """Which Xids mark a GPU Unhealthy: all (absent) or only the listed ones."""
    event_types: tuple[EventType, ...] | None = None
    """NVML event types to watch (reference plugin); Xid critical errors are watched here."""
    disabled: StrictBool | None = None
    """The reference's spelling of enabled: false."""
    ignored_xids_reference: tuple[Xid, ...] | None = Field(None, alias="ignoredXIDs")
    """The reference's spelling of ignoredXids."""
    recovery_quiet_period_seconds: Annotated[StrictInt, Field(ge=0)] = 60
    """An Unhealthy device is Healthy again once NVML answers and no fault came for this long."""
    recovery_check_seconds: Annotated[StrictInt, Field(ge=1)] = 30
    """First recheck of an Unhealthy device; the delay doubles while NVML does not answer."""
    recovery_check_max_seconds: Annotated[StrictInt, Field(ge=1)] = 300
    """Longest delay between two rechecks of an Unhealthy device."""

    @model_validator(mode="after")
    def _resolve(self) -> Health:
        resolved = rules.resolve_health(self)
        rules.raise_issues(resolved.issues)
        if self.recovery_check_max_seconds < self.recovery_check_seconds:
            rules.raise_issues(
                [
                    rules.Issue(
                        ("recoveryCheckMaxSeconds",),
                        f"must be >= recoveryCheckSeconds ({self.recovery_check_seconds}); "
                        f"got {self.recovery_check_max_seconds}",
                    )
                ]
            )
        # Still inside validation, before anyone holds the instance: the one place the frozen
        # model is written, so that no later code sees the reference's spellings.
        self.__dict__.update(resolved.update)
        return self


class Imex(Strict):
    """IMEX channels (reference plugin); accepted for compatibility, no effect here."""

    channel_ids: tuple[StrictInt, ...] = Field((), alias="channelIDs")
    required: StrictBool = False


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

    @model_validator(mode="after")
    def _profiles_need_mig(self) -> MigLayout:
        if not self.enabled and self.profiles:
            rules.raise_issues(
                [rules.Issue(("profiles",), "profiles need MIG: remove them or set enabled: true")]
            )
        return self


class Partitioning(Strict):
    """Declared device layouts, applied by the plugin."""

    mig: tuple[MigLayout, ...] = ()
    """MIG layouts; entries must select disjoint GPUs."""

    @model_validator(mode="after")
    def _disjoint(self) -> Partitioning:
        rules.raise_issues(rules.partitioning_issues(self))
        return self


class Config(Strict):
    """A whole config: one named entry of the ConfigMap, or one file."""

    version: Literal["v1"] = "v1"
    """Config format version; only v1."""
    flags: Flags = Flags()
    resources: Resources = Resources()
    sharing: SharingSection = SharingSection()
    health: Health = Health()
    partitioning: Partitioning | None = None
    """Declared MIG layouts; absent: the plugin never changes MIG."""
    imex: Imex | None = None
    """IMEX channels: accepted for compatibility; has no effect here."""

    @model_validator(mode="after")
    def _across_sections(self) -> Config:
        rules.raise_issues(rules.config_issues(self))
        return self
