"""What the daemon tells the Node about itself (`--node-status on`), decided here as values.

The daemon calls these at the points that matter to an admin: a config applied or rejected,
a GPU's MIG layout pending or applied, a GPU turning Unhealthy or recovering. This module turns
them into Node events and the config-state label; the reporter writes them in the background.
Without node status (no `--node-name`, `--node-status off`, no credentials) it does nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.mig.state import GpuMigState, MigState
from sharing_plugin.plan.model import Plan

if TYPE_CHECKING:
    from sharing_plugin.observability.nodestatus import NodeStatusReporter, State


class NodeReport:
    """The daemon's reports about the node; a no-op without a reporter."""

    def __init__(self, reporter: NodeStatusReporter | None) -> None:
        self.reporter = reporter
        self._config: str | None = None
        self._mig: dict[str, GpuMigState] = {}
        self._failed = False

    def applied(self, *, name: str | None, hash_: str, generation: int, plan: Plan) -> None:
        self._failed = False
        if self.reporter is None:
            return
        shown = name or "<default>"
        self._config = f"{shown}@{hash_[:12]}" if hash_ else shown
        counts = ", ".join(f"{r.name}: {len(r.devices)}" for r in plan.resources) or "nothing"
        self.reporter.event(
            "ConfigApplied", f"config {shown} applied (generation {generation}): {counts}"
        )
        self.reporter.state(self._state(), self._config)

    def rejected(self, first_line: str) -> None:
        self._failed = True
        if self.reporter is None:
            return
        self.reporter.event("ConfigRejected", first_line, warning=True)
        self.reporter.state("failed", None)

    def mig(self, states: Mapping[str, GpuMigState], inventory: Inventory | None) -> None:
        before, self._mig = self._mig, dict(states)
        if self.reporter is None:
            return
        for uuid, state in states.items():
            if before.get(uuid) == state:
                continue
            gpu = _gpu_name(uuid, inventory)
            if state.state is MigState.PENDING:
                self.reporter.event("MigLayoutPending", f"{gpu}: {state.reason}", warning=True)
            elif state.state is MigState.APPLIED:
                self.reporter.event("MigLayoutApplied", f"{gpu}: declared MIG layout applied")
        if not self._failed and self._config is not None:
            self.reporter.state(self._state(), None)

    def health(
        self, before: Mapping[str, bool], after: Mapping[str, bool], inventory: Inventory | None
    ) -> None:
        if self.reporter is None:
            return
        for uuid in sorted(set(before) | set(after)):
            was, now = before.get(uuid, True), after.get(uuid, True)
            if was == now or not uuid.startswith("GPU-"):
                continue
            gpu = _gpu_name(uuid, inventory)
            if now:
                self.reporter.event("GpuRecovered", f"{gpu} is Healthy again")
            else:
                self.reporter.event("GpuUnhealthy", f"{gpu} is Unhealthy", warning=True)

    def _state(self) -> State:
        if self._failed:
            return "failed"
        pending = any(s.state is MigState.PENDING for s in self._mig.values())
        return "pending" if pending else "success"


def _gpu_name(uuid: str, inventory: Inventory | None) -> str:
    for gpu in inventory.gpus if inventory is not None else ():
        if gpu.uuid == uuid:
            return f"GPU {gpu.index} ({uuid})"
    return uuid
