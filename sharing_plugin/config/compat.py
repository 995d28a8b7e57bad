"""The reference plugin's other spellings of a value, read into ours before validation.

The reference's Go decoder is lenient in places where our model is typed: one strategy or a
list, an empty string meaning "auto", a duration as a Go string or nanoseconds, `criticalXIDs:
all`, a time-slicing `strategy` that must be empty. Each field type here accepts exactly what the
reference accepts, normalises it, and refuses the rest with what to write instead; its JSON schema
says the same, so editors agree with the loader.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    WithJsonSchema,
)
from pydantic_core import PydanticCustomError

from sharing_plugin.config.base import DeviceDiscoveryStrategy, DeviceListStrategy, Xid

__all__ = [
    "GO_DURATION_PATTERN",
    "CriticalXids",
    "DeviceListStrategies",
    "DiscoveryStrategy",
    "GoDuration",
    "TimeSlicingStrategy",
]

# Go's time.ParseDuration grammar (the reference decodes gfd.sleepInterval with it).
GO_DURATION_PATTERN = r"^[-+]?(0|(([0-9]+\.?[0-9]*|\.[0-9]+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h))+)$"


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


DeviceListStrategies = Annotated[
    tuple[DeviceListStrategy, ...], BeforeValidator(_one_or_many), Field(min_length=1)
]

DiscoveryStrategy = Annotated[DeviceDiscoveryStrategy | None, BeforeValidator(_empty_is_auto)]

# Optional: gpu-feature-discovery's sleepInterval is only ever read for compatibility.
GoDuration = Annotated[
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
