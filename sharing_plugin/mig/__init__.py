"""MIG partitioning: the pure placement solver and the plan it produces."""

from __future__ import annotations

from sharing_plugin.mig.layout import MigCreate, MigInstance, MigPendingError, MigPlan
from sharing_plugin.mig.solver import place_layout, plan_mig, validate_layout

__all__ = [
    "MigCreate",
    "MigInstance",
    "MigPendingError",
    "MigPlan",
    "place_layout",
    "plan_mig",
    "validate_layout",
]
