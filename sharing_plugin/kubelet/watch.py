"""Noticing kubelet restarts by watching `<kubelet-dir>/device-plugins`.

A restarting kubelet deletes every file in device-plugins/ but its checkpoint, our sockets
included, then listens on a new `kubelet.sock`; every plugin has to register again, on a fresh
socket, and nothing tells it but the file system (devicemanager `CleanupPluginDirectory`). So we
watch the directory with inotify and react to two things: `kubelet.sock` created
(kubelet restarted) and one of our own sockets deleted (someone removed it; kubelet can no longer
reach us). No polling: an idle node costs no CPU.

A directory that does not exist yet (kubelet not installed or not started) is waited for by
watching its nearest existing ancestor, one level at a time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

from sharing_plugin.kit.fswatch import Change, DirectoryGone, DirectoryWatch, FileChange
from sharing_plugin.kubelet.api.constants import DEVICE_PLUGINS_DIR, KUBELET_SOCKET

log = logging.getLogger(__name__)

# A kubelet restart is a burst (kubelet.sock removed, plugin sockets removed, kubelet.sock
# created) within a few milliseconds; 50 ms of quiet groups it into one batch without delaying
# the re-registration noticeably. Nothing wakes while the directory is quiet.
DEBOUNCE_S = 0.05
# Back-off after the watch itself fails (directory removed under us, permission trouble).
_BACKOFF_S = (0.1, 0.5, 1.0, 2.0, 5.0)


def _exists(path: Path) -> bool:
    # One stat() of a local path: never blocks long enough to matter to the event loop.
    return path.exists()


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


async def wait_for_path(path: Path) -> None:
    """Return once `path` exists, watching (never polling) the nearest existing ancestor."""
    failures = 0
    while not _exists(path):
        directory = _nearest_existing(path.parent)
        try:
            async with DirectoryWatch(directory, debounce_s=DEBOUNCE_S) as watch:
                while not _exists(path) and _nearest_existing(path.parent) == directory:
                    await watch.changes()
            failures = 0
        except DirectoryGone:
            continue  # the ancestor went away: watch the next one that exists
        except OSError as exc:  # the directory cannot be watched or read: back off, retry
            delay = _BACKOFF_S[min(failures, len(_BACKOFF_S) - 1)]
            failures += 1
            log.warning("cannot watch %s for %s (%s); retrying in %gs", directory, path, exc, delay)
            await asyncio.sleep(delay)


class KubeletWatcher:
    """Calls back when kubelet restarts or when one of our sockets is deleted; runs forever.

    `own_sockets` is asked at each batch of changes, so sockets started or stopped since are
    accounted for. When kubelet restarted, only `on_kubelet_restart` is called for that batch:
    re-registering every resource covers the sockets kubelet's start-up cleanup removed.
    A failing callback is logged and the watch goes on.
    """

    def __init__(
        self,
        kubelet_dir: Path,
        on_kubelet_restart: Callable[[], Awaitable[None]],
        on_socket_removed: Callable[[Path], Awaitable[None]],
        *,
        own_sockets: Callable[[], Iterable[Path]],
    ) -> None:
        self._plugin_dir = Path(kubelet_dir) / DEVICE_PLUGINS_DIR
        self._kubelet_socket = self._plugin_dir / KUBELET_SOCKET
        self._on_kubelet_restart = on_kubelet_restart
        self._on_socket_removed = on_socket_removed
        self._own_sockets = own_sockets
        # Set while device-plugins/ is being watched: changes from then on are not missed.
        self.ready = asyncio.Event()

    async def run(self) -> None:
        failures = 0
        while True:
            await wait_for_path(self._plugin_dir)
            delay = 0.0
            try:
                inode = self._plugin_dir.stat().st_ino
                async with DirectoryWatch(self._plugin_dir, debounce_s=DEBOUNCE_S) as watch:
                    failures = 0
                    self.ready.set()
                    while True:
                        changes = await watch.changes()
                        await self._dispatch(changes)
                        if not self._same_directory(inode):
                            break
            except DirectoryGone:
                pass  # removed (and maybe recreated): the inotify watch died with it
            except OSError as exc:
                delay = _BACKOFF_S[min(failures, len(_BACKOFF_S) - 1)]
                failures += 1
                log.warning("cannot watch %s (%s); retrying in %gs", self._plugin_dir, exc, delay)
            finally:
                self.ready.clear()
            if not delay:
                log.info("%s was replaced; watching it again", self._plugin_dir)
            else:
                await asyncio.sleep(delay)

    def _same_directory(self, inode: int) -> bool:
        try:
            return self._plugin_dir.stat().st_ino == inode
        except OSError:
            return False

    async def _dispatch(self, changes: list[FileChange]) -> None:
        created = {c.path for c in changes if c.change is Change.ADDED}
        deleted = {c.path for c in changes if c.change is Change.DELETED}
        if self._kubelet_socket in created and self._kubelet_socket.exists():
            log.info("kubelet restarted (%s created): registering again", self._kubelet_socket)
            await self._call(self._on_kubelet_restart())
            return
        for socket in sorted(deleted & {Path(s) for s in self._own_sockets()}):
            if not socket.exists():
                log.warning("our socket %s was deleted: serving on a new one", socket)
                await self._call(self._on_socket_removed(socket))

    @staticmethod
    async def _call(callback: Awaitable[None]) -> None:
        try:
            await callback
        except Exception:
            log.exception("handling a kubelet restart failed; waiting for the next change")
        # A cancellation swallowed inside the callback (grpc.aio's shutdown on Python 3.11)
        # must still end the watch.
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise asyncio.CancelledError
