"""What every config section is built from: the strict base model, enums, limits, field types.

Sections live in several modules but must read alike: frozen, camelCase keys as the reference
plugin writes them, unknown keys refused, strict scalars (`"true"` is not a bool, `2.0` is not an
int, because the reference's Go decoder refuses those too). Keeping the base, the strategy enums
and the shared field types in one place is what keeps them alike.

An `Issue` is what a rule between values reports (an overlap, a contradiction): the path inside
the config it is about and what to do. It is a plain value, not a validation error, so that a
rule is checked on a built config and still reported beside the field errors, at its line.
"""

from __future__ import annotations

import copy
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    StrictInt,
    StrictStr,
    WithJsonSchema,
)
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from sharing_plugin.config.devices import (
    DEVICES_JSON_SCHEMA,
    DeviceSelection,
    dump_devices,
    parse_devices,
)
from sharing_plugin.config.names import RESOURCE_NAME_PATTERN, normalise_resource_name

__all__ = [
    "DEFAULT_IGNORED_XIDS",
    "MAX_DEVICES_PER_RESOURCE",
    "MIG_PROFILE_PATTERN",
    "AllocationPolicy",
    "DeviceDiscoveryStrategy",
    "DeviceIdStrategy",
    "DeviceListStrategy",
    "Devices",
    "EventType",
    "Issue",
    "Loc",
    "MigStrategy",
    "ResourceName",
    "SharingKind",
    "Strict",
    "Xid",
    "strict_str",
]

DEFAULT_IGNORED_XIDS: tuple[int, ...] = (13, 31, 43, 45, 68, 109)
MAX_DEVICES_PER_RESOURCE = 60_000  # kubelet's 4 MiB ListAndWatch limit at ~59 bytes per device
MIG_PROFILE_PATTERN = r"^[1-8]g\.[0-9]+gb(\+[a-z]+)*$"

Loc = tuple[str | int, ...]
"""A path inside a config, keys as written: `("sharing", "mps", "resources", 0)`."""


@dataclass(frozen=True, slots=True)
class Issue:
    """A broken rule between values: where inside the config, and what to do."""

    loc: Loc
    message: str


class Strict(BaseModel):
    """Base of every config section: frozen, camelCase keys, unknown keys rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        field_title_generator=lambda name, info: info.alias or to_camel(name),
    )


class MigStrategy(StrEnum):
    """How MIG devices are advertised: not at all, all as nvidia.com/gpu, or per profile."""

    NONE = "none"
    SINGLE = "single"
    MIXED = "mixed"


class DeviceListStrategy(StrEnum):
    """How a container is told its devices: an env var, volume mounts or CDI names."""

    ENVVAR = "envvar"
    VOLUME_MOUNTS = "volume-mounts"
    CDI_ANNOTATIONS = "cdi-annotations"
    CDI_CRI = "cdi-cri"


class DeviceIdStrategy(StrEnum):
    """What a container is told of each device: its UUID or its index."""

    UUID = "uuid"
    INDEX = "index"


class AllocationPolicy(StrEnum):
    """How replicas are picked: spread over the GPUs, or one GPU filled first."""

    DISTRIBUTED = "distributed"
    PACKED = "packed"


class DeviceDiscoveryStrategy(StrEnum):
    """The reference's device discovery choice (accepted; devices are found through NVML)."""

    AUTO = "auto"
    NVML = "nvml"
    TEGRA = "tegra"


class EventType(StrEnum):
    """NVML event types the reference plugin's `health.eventTypes` may list."""

    XID_CRITICAL_ERROR = "EventTypeXidCriticalError"
    DOUBLE_BIT_ECC_ERROR = "EventTypeDoubleBitEccError"
    SINGLE_BIT_ECC_ERROR = "EventTypeSingleBitEccError"


class SharedDevices(StrEnum):
    """How `run-dra` publishes a shared GPU: one device whose memory claims consume
    (`capacity`, Kubernetes 1.34+ with consumable capacity), or one device per replica."""

    CAPACITY = "capacity"
    REPLICAS = "replicas"


class SharingKind(StrEnum):
    """How a resource's devices are shared: not at all, by time-slicing, or through MPS."""

    NONE = "none"
    TIME_SLICING = "time-slicing"
    MPS = "mps"


def strict_str(value: Any) -> str:
    """A plain validator's own string check: it replaces pydantic's, so it must refuse non-str."""
    if not isinstance(value, str):
        raise PydanticCustomError("string_type", "Input should be a valid string")
    return value


ResourceName = Annotated[
    StrictStr,
    PlainValidator(lambda v: normalise_resource_name(strict_str(v))),
    WithJsonSchema(
        {
            "type": "string",
            "pattern": RESOURCE_NAME_PATTERN,
            # kubelet refuses names in the reserved kubernetes.io domain.
            "not": {"pattern": r"^([^/]*\.)?kubernetes\.io/"},
            "description": "An extended resource name; without '/' it gets 'nvidia.com/'.",
        }
    ),
]


def _devices_json_schema() -> dict[str, Any]:
    # Every object of the schema carries a description (editors show it on hover); the
    # product selector is the one object inside a device list.
    schema = copy.deepcopy(DEVICES_JSON_SCHEMA)
    for branch in schema["anyOf"]:
        for item in branch.get("items", {}).get("anyOf", ()):
            if "product" in item.get("properties", {}):
                item.setdefault(
                    "description",
                    "Every GPU whose product name, as NVML reports it, matches this glob "
                    "(only * is a wildcard).",
                )
    return schema


Devices = Annotated[
    DeviceSelection,
    PlainValidator(parse_devices),
    PlainSerializer(dump_devices),
    WithJsonSchema(_devices_json_schema()),
]

Xid = Annotated[StrictInt, Field(ge=0)]


def sections_in(annotation: Any) -> Iterator[tuple[type[BaseModel], bool]]:
    """The config sections a field's annotation holds (`Section`, `Section | None`,
    `tuple[Section, ...]`), and whether they are list entries."""
    origin = typing.get_origin(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation, False
    elif origin is tuple:
        for arg in typing.get_args(annotation):
            for model, _ in sections_in(arg):
                yield model, True
    elif origin in (typing.Union, types.UnionType, typing.Annotated):
        for arg in typing.get_args(annotation):
            yield from sections_in(arg)
