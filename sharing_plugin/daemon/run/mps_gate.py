"""The plugin side of MPS: an MPS resource's devices are Healthy only while its daemon serves.

A pod admitted onto an MPS replica with no control daemon behind it gets a pipe directory that
nobody answers, and its CUDA calls fail. So `run` follows each MPS resource's state file (one
inotify watch per resource, through the `mps` adapter) and marks every device of a resource
whose daemon is not serving -- not started yet, dead, restarting, or no longer vouched for --
Unhealthy, the way GPU health does; kubelet then admits no new pod onto it. Running pods are
not touched. `/status` shows each daemon's state, pid, limits and restarts, and the restarts
the control side reports are counted in the metrics.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sharing_plugin.kit.tasks import TaskOwner
from sharing_plugin.observability.metrics import Metrics
from sharing_plugin.observability.status import StatusBoard
from sharing_plugin.plan.model import Plan
from sharing_plugin.plan.mps import MpsDaemon

if TYPE_CHECKING:
    from sharing_plugin.mps import RecordView

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Watched:
    root: str
    task: asyncio.Task[Any]
    view: RecordView
    restarts: int = 0  # restarts already counted in the metrics


class MpsGate:
    """Watches each MPS resource's daemon and gates its devices' health on it."""

    def __init__(
        self,
        *,
        tasks: TaskOwner,
        status: StatusBoard,
        metrics: Metrics,
        on_change: Callable[[], Awaitable[None]],
    ) -> None:
        self._tasks = tasks
        self._status = status
        self._metrics = metrics
        self._on_change = on_change
        self._watched: dict[str, _Watched] = {}

    def follow(self, daemons: tuple[MpsDaemon, ...]) -> None:
        """Watch exactly the daemons of the plan about to be applied."""
        wanted = {d.resource: d.root for d in daemons}
        for name, watched in list(self._watched.items()):
            if wanted.get(name) != watched.root:
                watched.task.cancel()
                del self._watched[name]
                self._status.set_mps(name, None)
        for name, root in wanted.items():
            if name in self._watched:
                continue
            # Imported with the first MPS resource: a node without one never loads the adapter.
            from sharing_plugin.mps import current_view, watch_record

            # What the file says now, so the first plan applied is already gated right.
            view = current_view(name, Path(root))
            task = self._tasks.spawn(
                watch_record(name, Path(root), self._on_view), name=f"mps-watch:{name}"
            )
            self._watched[name] = _Watched(root, task, view)
            self._record(self._watched[name], view)

    def gate(self, plan: Plan) -> Plan:
        """`plan` with every device of an MPS resource whose daemon does not serve Unhealthy."""
        down = {
            d.resource
            for d in plan.mps
            if (w := self._watched.get(d.resource)) is None or not w.view.serving
        }
        if not down:
            return plan
        return replace(
            plan,
            resources=tuple(
                r.with_health(frozenset(d.gpu_uuid for d in r.devices)) if r.name in down else r
                for r in plan.resources
            ),
        )

    def serving(self, resource: str) -> bool:
        watched = self._watched.get(resource)
        return watched is not None and watched.view.serving

    async def _on_view(self, view: RecordView) -> None:
        watched = self._watched.get(view.resource)
        if watched is None:
            return
        before = watched.view
        watched.view = view
        self._record(watched, view)
        if before.serving != view.serving:
            if view.serving:
                log.info("MPS daemon for %s serves: %s", view.resource, view.to_status())
            else:
                log.warning(
                    "MPS daemon for %s is %s (%s): its devices are Unhealthy until it serves",
                    view.resource,
                    view.state,
                    view.to_status()["reason"] or "no reason given",
                )
            await self._on_change()

    def _record(self, watched: _Watched, view: RecordView) -> None:
        self._status.set_mps(view.resource, view.to_status())
        if view.record is not None:
            restarts = view.record.restarts
            # A smaller count: the state file was made anew; count from there.
            added = restarts - watched.restarts if restarts >= watched.restarts else restarts
            self._metrics.count_mps_restarts(view.resource, added)
            watched.restarts = restarts
