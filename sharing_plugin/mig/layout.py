"""The values the MIG solver speaks: current instances, instances to create, and the plan.

A plan is data, not actions: the apply step destroys then creates exactly what it lists, with
explicit placements, so NVML never picks a placement (its first-fit choice is what makes
creation order matter and fail with INSUFFICIENT_RESOURCES).
"""

from __future__ import annotations

from dataclasses import dataclass

from sharing_plugin.errors import MigError
from sharing_plugin.gpus.inventory import MigPlacement


@dataclass(frozen=True, slots=True)
class MigInstance:
    """A GPU instance that exists now; `id` is opaque to the solver (a GI id or a MIG UUID)."""

    id: str
    profile: str
    placement: MigPlacement

    def __str__(self) -> str:
        return f"{self.profile} at {_slices(self.placement)} ({self.id})"


@dataclass(frozen=True, slots=True)
class MigCreate:
    """A GPU instance to create, with the placement to pass to NVML."""

    profile: str
    placement: MigPlacement

    def __str__(self) -> str:
        return f"{self.profile} at {_slices(self.placement)}"


@dataclass(frozen=True, slots=True)
class MigPlan:
    """Keep these, destroy those, then create these; each part ordered by placement start.

    Destroys come first when applied: a created instance may need slices a destroyed one frees.
    """

    keep: tuple[MigInstance, ...]
    destroy: tuple[MigInstance, ...]
    create: tuple[MigCreate, ...]

    @property
    def changes(self) -> bool:
        return bool(self.destroy or self.create)

    @property
    def layout(self) -> tuple[MigCreate, ...]:
        """The GPU's instances once the plan is applied, ordered by placement start."""
        final = [MigCreate(k.profile, k.placement) for k in self.keep] + list(self.create)
        return tuple(sorted(final, key=lambda c: (c.placement.start, c.profile)))

    def describe(self) -> tuple[str, ...]:
        """One line per action, in the order they are applied (for `plan` and logs)."""
        return tuple(
            [f"destroy {d}" for d in self.destroy]
            + [f"create {c}" for c in self.create]
            + [f"keep {k}" for k in self.keep]
        )


class MigPendingError(MigError):
    """The layout fits the GPU, but only once pods release the instances in `blocking`.

    The GPU must stay as it is until then; the apply step retries when the instances are free.
    """

    def __init__(self, message: str, *, blocking: tuple[MigInstance, ...]) -> None:
        self.blocking = blocking
        super().__init__(message)


def _slices(placement: MigPlacement) -> str:
    if placement.size == 1:
        return f"slice {placement.start}"
    return f"slices {placement.start}-{placement.end - 1}"
