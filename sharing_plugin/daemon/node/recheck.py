"""Asking again while pods hold something: how a change that waits for pods gets done.

A device that drains, a MIG layout whose instance a pod holds, an MPS daemon whose clients
still run: each waits until pods release what they hold, and nothing tells when they do (the
kubelet's PodResources and the DRA checkpoint are asked, never heard from). So a command that
has such a change asks again every `HELD_RECHECK_S` while something waits, and not at all once
nothing does: an idle node runs no periodic work.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from sharing_plugin.kit.tasks import TaskOwner

__all__ = ["HELD_RECHECK_S", "HeldRecheck"]

HELD_RECHECK_S = 2.0


class HeldRecheck:
    """Calls `again` every `every_s` from `schedule()` on, until it says nothing waits."""

    def __init__(
        self,
        tasks: TaskOwner,
        *,
        name: str,
        every_s: float,
        again: Callable[[], Awaitable[bool]],
    ) -> None:
        """`again` carries the waiting change out if it can now; True while something still
        waits for pods."""
        self._tasks = tasks
        self._name = name
        self._every_s = every_s
        self._again = again
        self._task: asyncio.Task[Any] | None = None

    def schedule(self) -> None:
        """Something waits for pods: ask again in `every_s` (a no-op while already asking)."""
        if self._task is None or self._task.done():
            self._task = self._tasks.spawn(self._loop(), name=self._name)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._every_s)
            if not await self._again():
                return
