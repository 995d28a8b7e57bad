"""Keeping the node's MIG layout in step with each config's `partitioning.mig`.

Before a config is planned, its declared layouts are checked against the node (an impossible
one rejects the config before anything is touched), then carried out through the reconciler
with what pods (or, in DRA mode, prepared claims) hold. A layout that must wait for a pod to
release an instance is pending: it is retried every `retry_s` seconds, through the pipeline's
own update path, until
it is applied or a new config replaces it. Each GPU's state is kept here as a value and shown
in /status. A dynamic entry (`partitioning.mig[].dynamic`: instances made per claim) is only
for a command that partitions GPUs per claim (`run-dra`, and only where the API server has
partitionable devices); elsewhere a config with one is rejected before anything is touched,
at the entry, saying why.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from sharing_plugin.config.model import Config
from sharing_plugin.daemon.node.mig import MigReconciler
from sharing_plugin.daemon.node.recheck import HeldRecheck
from sharing_plugin.errors import PlanError, Problem
from sharing_plugin.gpus.holders import Holder
from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.kit.tasks import TaskOwner
from sharing_plugin.mig.select import entry_path
from sharing_plugin.mig.state import GpuMigState, MigState
from sharing_plugin.observability.status import StatusBoard
from sharing_plugin.plan.node import plan_node

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Partitioned:
    """The node after an apply, whether it changed, and every selected GPU's layout state."""

    inventory: Inventory
    changed: bool
    states: Mapping[str, GpuMigState]


class MigLayouts:
    """Applies declared MIG layouts and retries the pending ones."""

    def __init__(
        self,
        reconciler: MigReconciler,
        *,
        status: StatusBoard,
        held_by: Callable[[Inventory], Awaitable[Mapping[str, Holder] | None]],
        tasks: TaskOwner,
        retry: Callable[[], Awaitable[None]],
        retry_s: float,
        dynamic: Callable[[], str | None] | None = None,
    ) -> None:
        """`dynamic` says, at each apply, why dynamic entries cannot be served now (None: they
        are); without it they are `run-dra`'s (`run` cannot serve them)."""
        self._reconciler = reconciler
        self._dynamic = dynamic or (lambda: NOT_HERE)
        self._status = status
        self._held_by = held_by
        self._retry = retry
        self._pending = False
        self._states: dict[str, GpuMigState] = {}
        self._retrying = HeldRecheck(
            tasks, name="mig-retry", every_s=retry_s, again=self._retry_pending
        )

    async def apply(self, config: Config, inventory: Inventory) -> Partitioned:
        """Make the GPUs match `config`; the node as it is now, whether it changed, the states.

        Raises PlanError (nothing touched) when a declared layout cannot fit its GPU, or when
        the config does not fit the node as the layouts would leave it.
        """
        refusal = self._dynamic()
        if refusal is not None and (refused := _dynamic_entries(config, refusal)):
            raise PlanError(refused)
        checked = plan_node(config, inventory)
        if checked.problems:
            raise PlanError(checked.problems)
        if config.partitioning is None and not self._states:
            return Partitioned(inventory, False, self._states)
        held = await self._held_by(inventory)
        outcome = await self._reconciler.reconcile(config, inventory, held)
        self._record(outcome.states)
        self._pending = any(s.state is MigState.PENDING for s in self._states.values())
        if self._pending:
            self._retrying.schedule()
        return Partitioned(outcome.inventory, outcome.changed, self._states)

    def _record(self, outcome: Mapping[str, tuple[MigState, str | None]]) -> None:
        """Keep and show the new states; a state that is not applied is logged when it changes,
        not at every retry of a layout that waits for days."""
        states = {gpu: GpuMigState(*state) for gpu, state in outcome.items()}
        for gpu, state in states.items():
            if state.state is not MigState.APPLIED and self._states.get(gpu) != state:
                log.warning("GPU %s MIG layout %s: %s", gpu, state.state.value, state.reason)
        self._states = states
        self._status.set_mig_states(self._states)

    @property
    def pending(self) -> bool:
        """Whether a layout waits (for a pod, a claim or a GPU reset) and is being retried."""
        return self._pending

    async def _retry_pending(self) -> bool:
        await self._retry()
        return self._pending


NOT_HERE = (
    "dynamic MIG is served by sharing-plugin run-dra only (instances created per claim); the "
    "device plugin (run) serves fixed layouts: run run-dra on this node, or remove dynamic and "
    "declare profiles"
)


def _dynamic_entries(config: Config, refusal: str) -> list[Problem]:
    """`refusal` at each dynamic entry."""
    entries = config.partitioning.mig if config.partitioning is not None else ()
    return [
        Problem(f"{entry_path(i)}.dynamic", refusal)
        for i, layout in enumerate(entries)
        if layout.dynamic
    ]
