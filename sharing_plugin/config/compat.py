"""The reference plugin's other spellings of a value, read into ours before validation.

The reference's Go decoder is lenient in places where our model is typed: one strategy or a
list, an empty string meaning "auto", a duration as a Go string, nanoseconds or `infinite`,
`criticalXIDs: all`, a time-slicing `strategy` that must be empty. Each field type here accepts
exactly what the reference accepts, normalises it, and refuses the rest with what to write
instead; its JSON schema says the same, so editors agree with the loader.

It is strict where the reference is: IMEX channel IDs other than `[]` or `[0]` stop the reference
at start, and a key written with no value (`timeSlicing:`, `devices:`, `rename:`) reaches its Go
decoders as JSON null, which some refuse. `without_nulls` reads every other empty key as absent,
as Go does, and leaves a `RefusedNull` where the reference refuses one, so validation reports it
at its line with the other problems.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    PlainSerializer,
    StrictFloat,
    StrictInt,
    StrictStr,
    WithJsonSchema,
)
from pydantic_core import PydanticCustomError

from sharing_plugin.config.base import DeviceDiscoveryStrategy, DeviceListStrategy, Xid

__all__ = [
    "GO_DURATION_PATTERN",
    "GO_INFINITE",
    "GO_MAX_DURATION",
    "CriticalXids",
    "DeviceListStrategies",
    "DiscoveryStrategy",
    "GoDuration",
    "ImexChannelIds",
    "RefusedNull",
    "TimeSlicingStrategy",
    "without_nulls",
]

# Go's time.ParseDuration grammar (the reference decodes gfd.sleepInterval with it).
GO_DURATION_PATTERN = r"^[-+]?(0|(([0-9]+\.?[0-9]*|\.[0-9]+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h))+)$"
# The reference's Duration reads `infinite` as the longest time.Duration and writes that back as
# `infinite` (gpu-feature-discovery then never re-labels).
GO_INFINITE = "infinite"
GO_MAX_DURATION = 2**63 - 1


def _one_or_many(value: Any) -> Any:
    # The reference accepts `deviceListStrategy: envvar` as well as a list of strategies.
    return [value] if isinstance(value, str) else value


def _empty_is_auto(value: Any) -> Any:
    # The reference treats an empty deviceDiscoveryStrategy like "auto".
    return "auto" if value == "" else value


def _go_duration(value: Any) -> Any:
    # The reference decodes a duration from a Go duration string ("60s", "1m30s"), a number of
    # nanoseconds, or exactly `infinite`.
    if value == GO_INFINITE:
        return GO_MAX_DURATION
    if isinstance(value, str) and not re.fullmatch(GO_DURATION_PATTERN, value):
        raise PydanticCustomError(
            "go_duration",
            "'{value}' is not a duration: write it like 60s, 5m or 1h30m, or infinite",
            {"value": value},
        )
    return value


def _dump_duration(value: str | int | float | None) -> str | int | float | None:
    return GO_INFINITE if value == GO_MAX_DURATION else value


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


def _imex_channel_ids(value: tuple[int, ...]) -> tuple[int, ...]:
    # The reference checks this at start (AssertChannelIDsValid) and exits on anything else.
    if value not in ((), (0,)):
        raise PydanticCustomError(
            "imex_channel_ids",
            "must be [] or [0] (got {got}): the reference plugin refuses any other channel IDs "
            'at start ("channelIDs must be [] or [0]"); write [0] or leave the key out',
            {"got": "[" + ", ".join(map(str, value)) + "]"},
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


_LIST_STRATEGY = {"type": "string", "enum": [s.value for s in DeviceListStrategy]}

DeviceListStrategies = Annotated[
    tuple[DeviceListStrategy, ...],
    BeforeValidator(_one_or_many),
    Field(min_length=1),
    WithJsonSchema(
        {
            "anyOf": [
                _LIST_STRATEGY,
                {"type": "array", "items": _LIST_STRATEGY, "minItems": 1},
            ],
        }
    ),
]

DiscoveryStrategy = Annotated[
    DeviceDiscoveryStrategy | None,
    BeforeValidator(_empty_is_auto),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "enum": ["", *(s.value for s in DeviceDiscoveryStrategy)]},
                {"type": "null"},
            ],
        }
    ),
]

# Optional: gpu-feature-discovery's sleepInterval is only ever read for compatibility.
GoDuration = Annotated[
    StrictStr | StrictInt | StrictFloat | None,
    BeforeValidator(_go_duration),
    PlainSerializer(_dump_duration),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": GO_DURATION_PATTERN},
                {"const": GO_INFINITE},
                {"type": "number"},
            ],
            "description": "A Go duration (60s, 5m), a number of nanoseconds, or infinite "
            "(the longest duration).",
        }
    ),
]

ImexChannelIds = Annotated[
    tuple[StrictInt, ...],
    AfterValidator(_imex_channel_ids),
    WithJsonSchema(
        {
            "type": "array",
            "items": {"const": 0},
            "maxItems": 1,
            "description": "[] or [0]: the only IMEX channel lists the reference plugin starts "
            "with.",
        }
    ),
]

# None means all: every Xid not ignored counts, as when the key is left out.
CriticalXids = Annotated[
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
]

TimeSlicingStrategy = Annotated[
    Literal[""] | None,
    BeforeValidator(_time_slicing_strategy),
    WithJsonSchema({"const": "", "description": "Accepted for compatibility; no effect."}),
]


@dataclass(frozen=True, slots=True)
class RefusedNull:
    """A key written with no value where the reference's decoder refuses JSON null."""

    message: str

    def __repr__(self) -> str:
        return "null"


_EMPTY_TIME_SLICING = RefusedNull(
    "is empty: the reference plugin refuses it (no resources specified); list resources under "
    "it, or remove the key"
)
_EMPTY_DEVICES = RefusedNull(
    "is empty: the reference plugin refuses it (devices set as '' but the only valid string "
    "input is 'all'); write all, a count or a list, or remove the key to share all devices"
)
_EMPTY_RENAME = RefusedNull(
    "is empty: the reference plugin refuses it (incorrect format for resource name "
    "'nvidia.com/'); write the name to advertise, or remove the key"
)


def _refused_null(path: tuple[str | int, ...]) -> RefusedNull | None:
    # ReplicatedResources and ReplicatedDevices are Go values with their own UnmarshalJSON, which
    # encoding/json calls even for null; `mps` is a pointer, which null just leaves unset.
    match path:
        case ("sharing", "timeSlicing"):
            return _EMPTY_TIME_SLICING
        case ("sharing", "timeSlicing" | "mps", "resources", int(), "devices"):
            return _EMPTY_DEVICES
        case ("sharing", "timeSlicing" | "mps", "resources", int(), "rename"):
            return _EMPTY_RENAME
    return None


def without_nulls(value: Any, path: tuple[str | int, ...] = ()) -> Any:
    """`key:` with nothing after it means "not set", as in the reference's Go decoder, except
    where that decoder refuses it: there a `RefusedNull` stands in, for validation to report."""
    if isinstance(value, dict):
        kept: dict[Any, Any] = {}
        for key, item in value.items():
            where = (*path, key)
            if item is None:
                refused = _refused_null(where)
                if refused is not None:
                    kept[key] = refused
                continue
            kept[key] = without_nulls(item, where)
        return kept
    if isinstance(value, list):
        return [without_nulls(item, (*path, i)) for i, item in enumerate(value)]
    return value
