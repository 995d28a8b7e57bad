"""What a config source hands on: one outcome of reading the config, and what made it read.

Both sources (the mounted file or directory, and the ConfigMap read through the API) yield the
same `ConfigUpdate`, so the node pipeline treats them alike. What triggered an update is a
`Trigger` value, never a string compared by equality; it is logged as its value.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from enum import StrEnum

from sharing_plugin.config.loader import LoadedConfig
from sharing_plugin.errors import ConfigError


class Trigger(StrEnum):
    """Why the config was read, or the last good one carried out again."""

    START = "start"
    START_API_UNREACHABLE = "start (API unreachable)"
    FILE_CHANGED = "file changed"
    CONFIGMAP_CHANGED = "ConfigMap changed"
    MOUNT_CHANGED = "mounted copy changed"
    LABEL_CHANGED = "label changed"
    SIGHUP = "SIGHUP"
    # Not a read of the config: the last good one carried out again on a changed node.
    MIG_RETRY = "MIG layout pending"
    GPUS_FOUND = "GPUs found"

    @property
    def reapplies(self) -> bool:
        """True when nothing was read: not a reload (no reload counted, `lastError` kept)."""
        return self in (Trigger.MIG_RETRY, Trigger.GPUS_FOUND)

    @property
    def forced(self) -> bool:
        """True when the outcome is handed on even if it is the same as the last one (an
        admin asked: SIGHUP, or the node label named a config again)."""
        return self in (Trigger.SIGHUP, Trigger.LABEL_CHANGED)


@dataclass(frozen=True)
class ConfigUpdate:
    """One outcome of (re)reading the config.

    `loaded` is None only when no config path was given (the default config applies); `error`
    is set when reading, validating or selecting failed, and the consumer keeps its last good
    config.
    """

    name: str | None
    loaded: LoadedConfig | None
    error: ConfigError | None
    trigger: Trigger


class TriggeredSource:
    """What both sources share: the triggers waiting for the next read, and the stop."""

    def __init__(self) -> None:
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()
        self._triggers: list[Trigger] = []

    def trigger(self, trigger: Trigger) -> None:
        """Read or select again now (SIGHUP, label change); reported even if nothing changed."""
        self._triggers.append(trigger)
        self._wake.set()

    def stop(self) -> None:
        """End `updates()`: what it follows is released and the iterator returns."""
        self._stop.set()
        self._wake.set()

    async def _woken(self) -> list[Trigger] | None:
        """Once woken, the triggers that came since the last wake-up; None once stopped."""
        if self._stop.is_set():
            return None
        await self._wake.wait()
        self._wake.clear()
        if self._stop.is_set():
            return None
        triggers, self._triggers = self._triggers, []
        return triggers


def fingerprint(update: ConfigUpdate) -> tuple[object, ...]:
    """What makes two outcomes the same to a consumer (an unchanged re-read is not handed on)."""
    if update.error is not None:
        return ("error", str(update.error))
    if update.loaded is None:
        return ("default",)
    return ("config", update.name, update.loaded.source_hash, update.loaded.file)
