"""Supervision of long-lived asyncio tasks: every task is named, owned and accounted for.

A task created through `TaskOwner.spawn` logs its failure with its name, and an "eternal"
task (one that should run until shutdown) that ends early is logged as such, so a silently dead
ListAndWatch pusher or watcher is never a mystery. The owner cancels and awaits its tasks on
close, and raises `TasksStuckError` naming any that would not stop; nothing here sweeps
`asyncio.all_tasks()`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)


class TasksStuckError(RuntimeError):
    """Tasks still running after they were cancelled and given their grace period."""


class TaskOwner:
    """Owns a set of named tasks; `close()` cancels them all and waits for them to finish."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closing = False

    def spawn(
        self, coro: Coroutine[Any, Any, Any], *, name: str, eternal: bool = False
    ) -> asyncio.Task[Any]:
        if self._closing:
            coro.close()
            raise RuntimeError(f"{self._name}: cannot start {name!r} while closing")
        task = asyncio.create_task(coro, name=f"{self._name}:{name}")
        self._tasks.add(task)
        task.add_done_callback(lambda t: self._finished(t, eternal=eternal))
        return task

    def _finished(self, task: asyncio.Task[Any], *, eternal: bool) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("task %s failed: %s", task.get_name(), exc, exc_info=exc)
        elif eternal and not self._closing:
            log.error("task %s ended although it should run until shutdown", task.get_name())

    async def close(self, grace: float = 1.5) -> None:
        """Cancel every task and wait (bounded) for them to end."""
        self._closing = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=grace)
            if pending:
                # A task that ignores cancellation is a bug (a swallowed CancelledError): fail
                # loudly, so the tests that start it fail rather than log a line.
                names = ", ".join(sorted(t.get_name() for t in pending))
                raise TasksStuckError(f"{self._name}: did not stop within {grace:.1f}s: {names}")


def raise_if_cancelled() -> None:
    """In a loop that should end when its task is cancelled: pass on a cancellation that was
    requested but swallowed on the way.

    grpc.aio's server shutdown waits with `asyncio.wait_for`, which on Python 3.11 can swallow a
    cancellation that arrives as the shutdown completes; the task would then go on as if never
    cancelled, and a close waiting for it would wait in vain. Not for clean-up code, which may
    run in a task being cancelled and must finish.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
