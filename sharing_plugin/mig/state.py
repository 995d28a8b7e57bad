"""Where each GPU's declared MIG layout stands, as a value the daemon keeps and /status shows."""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple

from sharing_plugin.mig.desired import GpuMigAction


class MigState(StrEnum):
    """Where a GPU's declared MIG layout stands."""

    APPLIED = "applied"
    PENDING = "pending"  # waiting: a pod still holds an instance the new layout drops
    ERROR = "error"


class GpuMigState(NamedTuple):
    """One GPU's layout state and, unless applied, why."""

    state: MigState
    reason: str | None = None


def state_of(action: GpuMigAction) -> GpuMigState:
    """The state a GPU is in when `action` is what is left to do for it."""
    if action.error is not None:
        return GpuMigState(MigState.ERROR, action.error)
    if action.pending is not None:
        return GpuMigState(MigState.PENDING, action.pending)
    if action.changes:
        # Applied without an error, yet NVML still shows a different layout.
        return GpuMigState(
            MigState.ERROR, "after applying, the GPU still differs: " + "; ".join(action.describe())
        )
    return GpuMigState(MigState.APPLIED)
