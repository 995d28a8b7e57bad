"""Where the node pipeline tells what happened: logs, /status, metrics, and the Node.

The pipeline reports at the points that matter to an admin: a config applied or rejected, a
GPU's MIG layout pending or applied, a GPU turning Unhealthy or recovering, the API refusing or
answering again. `Reports` turns each into its log lines, the `/status` fields, the reload
metrics and, with node status on, Node events and the config-state label (`NodeReport`), which
a reporter writes in the background. Each part is optional: `mps-control` serves no /status,
`run-dra` files none of these Node events (its own, about claims, are the pool's). Without
node status (no `--node-name`, `--node-status off`, no credentials) the Node part does nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from sharing_plugin.config.memory import Enforcement
from sharing_plugin.daemon.node.outcome import Applied, Rejected
from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.mig.state import GpuMigState, MigState
from sharing_plugin.observability.metrics import Metrics
from sharing_plugin.observability.status import StatusBoard
from sharing_plugin.plan.model import Plan

if TYPE_CHECKING:
    from sharing_plugin.observability.nodestatus import NodeStatusReporter, State

log = logging.getLogger(__name__)


class Reports:
    """The pipeline's reports (see the module doc); `node` is set once the API client is known."""

    def __init__(self, *, status: StatusBoard | None, metrics: Metrics | None) -> None:
        self.status = status
        self.metrics = metrics
        self.node = NodeReport(None)
        self._api_trouble: str | None = None
        self._rejected: str | None = None  # the last rejection, until a config is applied

    def applied(self, applied: Applied) -> None:
        """A config was read and applied (not a re-apply: that is no reload)."""
        name, hash_, generation = applied.name, applied.source_hash, applied.generation
        self._rejected = None
        limits = applied.plan.memory_limits
        if self.status is not None:
            self.status.set_config(name=name, hash=hash_, generation=generation)
            self.status.set_memory_limits(
                {"enforce": "off", "gpus": {}} if limits is None else limits.document()
            )
        if self.metrics is not None:
            self.metrics.count_reload(True)
            self.metrics.set_config(name=name, hash_=hash_, generation=generation)
        self.node.applied(name=name, hash_=hash_, generation=generation, plan=applied.plan)

    def rejected(self, rejected: Rejected, *, kept: int | None) -> None:
        """An update changed nothing; `kept` is the generation still serving (None: none)."""
        lines = rejected.lines()
        what = "config rejected" if rejected.config_fault else "cannot apply config"
        fields = {"reason": rejected.trigger.value}
        for line in lines:
            log.error("%s (%s): %s", what, rejected.trigger.value, line, extra=fields)
        if kept is not None:
            log.error(
                "keeping the last good config (generation %d)",
                kept,
                extra={**fields, "generation": kept},
            )
        self._rejected = "; ".join(lines)
        if self.status is not None:
            self.status.set_error(self._rejected)
        if self.metrics is not None:
            self.metrics.count_reload(False)
        self.node.rejected(lines[0])

    def api_trouble(self, text: str | None) -> None:
        """API trouble (credentials refused, server away) shows in /status until it is over;
        then /status shows again what it showed before: a rejected config's error stays until
        a config is applied, whatever the API does meanwhile."""
        previous, self._api_trouble = self._api_trouble, text
        if self.status is None:
            if text is not None:
                log.warning("%s", text)
            return
        if text is not None:
            self.status.set_error(text)
        elif previous is not None and self.status.last_error == previous:
            self.status.set_error(self._rejected)


class NodeReport:
    """The daemon's reports about the node; a no-op without a reporter."""

    def __init__(self, reporter: NodeStatusReporter | None) -> None:
        self.reporter = reporter
        self._config: str | None = None
        self._mig: dict[str, GpuMigState] = {}
        self._failed = False
        self._unenforced: dict[str, str] = {}  # GPU UUID -> why its caps are not enforced

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
        self._memory_limits(plan)

    def _memory_limits(self, plan: Plan) -> None:
        """A Warning Event when the GPUs whose caps cannot be enforced change (the log and
        /status say it at every apply)."""
        state = plan.memory_limits
        unenforced = {
            uuid: s.reason or ""
            for uuid, s in (state.gpus.items() if state is not None else ())
            if not s.enforced
        }
        before, self._unenforced = self._unenforced, unenforced
        if state is None or unenforced == before or not unenforced:
            return
        assert self.reporter is not None
        outcome = (
            "their shared replicas are not advertised"
            if state.enforce is Enforcement.REQUIRED
            else "their replicas are advertised uncapped"
        )
        reasons = sorted(set(unenforced.values()))
        self.reporter.event(
            "MemoryLimitsNotEnforced",
            f"memoryLimits ({state.enforce.value}): {len(unenforced)} GPU(s) cannot enforce "
            f"caps ({'; '.join(reasons)}): {outcome}",
            warning=True,
        )

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
