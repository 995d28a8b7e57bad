"""Watching one directory through inotify, woken by the kernel only: nothing runs while idle.

Every watch of the plugin (the config file or mounted ConfigMap, kubelet's device-plugins
directory, a simulated node's fault list) is a watch of one directory, non-recursive, whose
changes arrive in bursts: kubelet swaps a ConfigMap's `..data` link in four steps, a restarting
kubelet removes every socket and then creates its own. A `DirectoryWatch` hands out a burst as
one batch: after the first event it waits until the directory has been quiet for `debounce_s`
(bounded by `max_batch_s`), then returns everything seen. The inotify descriptor is read from
the event loop (`add_reader`): no thread, no step, no timer while nothing changes.

The watch is armed when `async with` returns, so a caller that checks the file system right
after entering cannot miss a change made in between.
"""

from __future__ import annotations

import asyncio
import errno
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import overload

from asyncinotify import Event, Inotify, Mask

from sharing_plugin.kit.lifecycle import Service

__all__ = ["Change", "DirectoryGone", "DirectoryWatch", "FileChange"]

_MASK = (
    Mask.CREATE
    | Mask.DELETE
    | Mask.MOVED_FROM
    | Mask.MOVED_TO
    | Mask.MODIFY
    | Mask.CLOSE_WRITE
    | Mask.ATTRIB
    | Mask.DELETE_SELF
    | Mask.MOVE_SELF
    | Mask.ONLYDIR
)
_GONE = Mask.DELETE_SELF | Mask.MOVE_SELF | Mask.IGNORED | Mask.UNMOUNT


class Change(Enum):
    ADDED = "added"
    DELETED = "deleted"
    MODIFIED = "modified"


@dataclass(frozen=True, slots=True)
class FileChange:
    change: Change
    path: Path


class DirectoryGone(OSError):
    """The watched directory was removed, moved or unmounted: its watch is dead."""


class DirectoryWatch(Service):
    """An inotify watch on `directory`; `changes()` returns the next burst of changes in it."""

    def __init__(
        self, directory: Path, *, debounce_s: float = 0.02, max_batch_s: float = 0.2
    ) -> None:
        self.directory = Path(directory)
        self._debounce_s = debounce_s
        self._max_batch_s = max_batch_s
        self._inotify: Inotify | None = None
        self._gone = False
        self._pending: asyncio.Future[Event] | None = None

    async def start(self) -> None:
        inotify = Inotify()
        try:
            inotify.add_watch(self.directory, _MASK)
        except OSError:
            inotify.close()
            raise
        except Exception as exc:  # asyncinotify raises plain errors for some errnos
            inotify.close()
            raise OSError(f"cannot watch {self.directory}: {exc}") from exc
        self._inotify = inotify

    async def close(self) -> None:
        inotify, self._inotify = self._inotify, None
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.cancel()
            await asyncio.wait([pending])
        if inotify is not None:
            inotify.close()

    async def changes(self) -> list[FileChange]:
        """The next burst of changes, in the order they happened.

        Raises `DirectoryGone` (after returning what came before it) once the directory itself
        is removed or moved: its watch is dead and the caller must watch again.
        """
        inotify = self._inotify
        if inotify is None:
            raise RuntimeError("the watch is not armed: use `async with`")
        if self._gone:
            raise DirectoryGone(errno.ENOENT, "the watched directory is gone", str(self.directory))
        batch: list[FileChange] = []
        gone = _add(batch, await self._next(inotify, None), self.directory)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._max_batch_s
        while not gone:
            quiet = min(self._debounce_s, deadline - loop.time())
            if quiet <= 0:
                break
            event = await self._next(inotify, quiet)
            if event is None:
                break
            gone = _add(batch, event, self.directory)
        self._gone = gone
        if gone and not batch:
            raise DirectoryGone(errno.ENOENT, "the watched directory is gone", str(self.directory))
        return batch

    @overload
    async def _next(self, inotify: Inotify, within: None) -> Event: ...

    @overload
    async def _next(self, inotify: Inotify, within: float) -> Event | None: ...

    async def _next(self, inotify: Inotify, within: float | None) -> Event | None:
        """The next event; None when none came `within` that many seconds.

        One `get()` stays pending across calls and is never cancelled while the watch lives:
        cancelling it could drop events its reader had already taken from the descriptor (the
        reader runs in the same loop turn as the timeout). A caller that is cancelled leaves
        the pending get for the next call.
        """
        if self._pending is None:
            self._pending = asyncio.ensure_future(inotify.get())
        pending = self._pending
        done, _ = await asyncio.wait([pending], timeout=within)
        if not done:
            return None
        self._pending = None
        return pending.result()


def _add(batch: list[FileChange], event: Event, directory: Path) -> bool:
    """Append what `event` says to `batch`; True when the directory itself is gone."""
    if event.mask & _GONE:
        return True
    if event.mask & Mask.Q_OVERFLOW:
        # The kernel's queue overflowed and events were dropped: anything may have changed.
        batch.append(FileChange(Change.MODIFIED, directory))
        return False
    if event.name is None:
        return False
    path = directory / event.name
    if event.mask & (Mask.CREATE | Mask.MOVED_TO):
        batch.append(FileChange(Change.ADDED, path))
    elif event.mask & (Mask.DELETE | Mask.MOVED_FROM):
        batch.append(FileChange(Change.DELETED, path))
    else:
        batch.append(FileChange(Change.MODIFIED, path))
    return False
