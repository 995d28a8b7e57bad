"""The `memoryLimits` section: whether each share's GPU memory is capped by the driver.

Its own module, as `usage` is: the rest of the config says what is advertised; this says
whether a share's memory is a promise the GPU keeps. Off by default, so a config written for
NVIDIA's plugin keeps its meaning. YAML 1.1 reads an unquoted `off` as false: it is taken as
`off`, the way an admin wrote it; an unquoted `on` (true) names no mode and is refused.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import PlainSerializer, PlainValidator, StrictStr, WithJsonSchema
from pydantic_core import PydanticCustomError

from sharing_plugin.config.base import Strict, strict_str

DEFAULT_HOOK_PATH = "/usr/bin/nvidia-cdi-hook"
HOOK_PATH_ENV = "NVIDIA_CDI_HOOK_PATH"


class Enforcement(StrEnum):
    """How a share's memory cap is treated where the node cannot enforce it."""

    OFF = "off"  # no caps: shares are what the scheduler counts, as in NVIDIA's plugin
    BEST_EFFORT = "best-effort"  # cap where the node can; advertise everywhere
    REQUIRED = "required"  # a share that cannot be capped is not advertised


def _enforcement(value: Any) -> Enforcement:
    if value is False:  # `enforce: off`, unquoted
        return Enforcement.OFF
    choices = ", ".join(e.value for e in Enforcement)
    if value is True:
        raise PydanticCustomError(
            "enforce_mode",
            "{detail}",
            {"detail": f"true names no mode: write one of {choices}"},
        )
    text = strict_str(value)
    try:
        return Enforcement(text)
    except ValueError:
        raise PydanticCustomError(
            "enforce_mode",
            "{detail}",
            {"detail": f"{text!r} is not a mode: write one of {choices}"},
        ) from None


def _absolute(value: Any) -> str:
    text = strict_str(value)
    if not text.startswith("/"):
        raise PydanticCustomError(
            "absolute_path",
            "{detail}",
            {"detail": f"{text!r} is not an absolute path: write it from / as the plugin sees it"},
        )
    return text


class MemoryLimits(Strict):
    """GPU memory caps on shares (time-slicing and MPS replicas, DRA shares), set by the driver
    through the container toolkit's CDI hook `apply-cuda-memory-limits` (driver R615+, cgroup
    v2, CDI enabled in the runtime)."""

    enforce: Annotated[
        Enforcement,
        PlainValidator(_enforcement),
        PlainSerializer(lambda mode: mode.value, return_type=str),
        WithJsonSchema(
            {
                "anyOf": [
                    {"type": "string", "enum": [e.value for e in Enforcement]},
                    {"const": False, "description": "YAML's reading of an unquoted off"},
                ]
            }
        ),
    ] = Enforcement.OFF
    """off (default): no caps; best-effort: cap each share where the node can enforce it and
    say where not; required: a shared resource on a GPU that cannot be capped is not advertised."""
    hook_path: (
        Annotated[
            StrictStr,
            PlainValidator(_absolute),
            WithJsonSchema({"type": "string", "pattern": "^/"}),
        ]
        | None
    ) = None
    """The toolkit's `nvidia-cdi-hook` as the plugin and the runtime see it (default:
    $NVIDIA_CDI_HOOK_PATH, else /usr/bin/nvidia-cdi-hook)."""

    @property
    def on(self) -> bool:
        return self.enforce is not Enforcement.OFF


def hook_path(limits: MemoryLimits, env_default: str | None) -> str:
    """The hook path in force: the config's, else the environment's default, else the toolkit's."""
    return limits.hook_path or env_default or DEFAULT_HOOK_PATH
