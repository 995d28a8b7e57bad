"""The config as a stream of validated outcomes: read once at start, then after every change.

An admin edits a file, kubelet swaps a mounted ConfigMap's `..data` symlink, or the node label
names another config; each becomes a `ConfigUpdate` holding either the selected, validated
config or the precise error, so the consumer can keep serving its last good config.

Why it is shaped so:
- kubelet updates a ConfigMap volume by writing a new timestamped directory and renaming a
  `..data_tmp` symlink over `..data` (atomic), then deleting the old directory. A watch on the
  old target would die with it, so the directory that holds `..data` is watched, never a target.
- A deleted file must be noticed when it comes back, so a file is watched through its parent
  directory; if a directory on the way is missing, the nearest existing ancestor is watched
  until the path can be watched again.
- The watcher runs in its own task for the life of `updates()`, so changes that land while
  the consumer applies the previous update are never lost; they only mark the source dirty.
  Reads then coalesce: whatever arrives meanwhile, the next read sees the latest state.
- A plain file can be caught half-written; an error from a change-driven read is only
  reported once the path has been quiet for `error_settle_ms`, so the fix that follows a torn
  write hides it. Errors from `trigger()` (SIGHUP, label) are reported at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Callable
from pathlib import Path

from sharing_plugin.config.selection import select
from sharing_plugin.errors import ConfigError, Problem
from sharing_plugin.kit.fswatch import DirectoryGone, DirectoryWatch
from sharing_plugin.kit.tasks import TaskOwner
from sharing_plugin.sources.files import load_configs
from sharing_plugin.sources.update import ConfigUpdate, Trigger, TriggeredSource, fingerprint

log = logging.getLogger(__name__)

_RETRY_MIN_S = 0.2
_RETRY_MAX_S = 10.0


class ConfigSource(TriggeredSource):
    """Reads the config at `path` and tells about every change to it (see the module doc)."""

    def __init__(
        self,
        path: Path | None,
        *,
        requested_name: str | None = None,
        label_value: Callable[[], str | None] | None = None,
        debounce_ms: int = 20,
        error_settle_ms: int = 100,
    ) -> None:
        self._path = path
        self._requested_name = requested_name
        self._label_value = label_value or (lambda: None)
        self._debounce_s = debounce_ms / 1000
        self._error_settle_s = error_settle_ms / 1000
        super().__init__()
        self._dirty = False
        self._last: tuple[object, ...] | None = None

    @property
    def path(self) -> Path | None:
        return self._path

    def read(self, trigger: Trigger = Trigger.START) -> ConfigUpdate:
        """Read, validate and select now (start-up, `plan`); remembered as the latest outcome."""
        update = self._read(trigger)
        self._last = fingerprint(update)
        return update

    def _read(self, trigger: Trigger) -> ConfigUpdate:
        if self._path is None:
            return ConfigUpdate(None, None, None, trigger)
        try:
            configs = load_configs(self._path)
            name, loaded = select(configs, self._label_value(), self._requested_name)
        except ConfigError as exc:
            return ConfigUpdate(None, None, exc, trigger)
        except OSError as exc:  # a path that changed under us mid-read: report, keep watching
            where = Problem(path="", message=f"cannot read: {exc}", file=str(self._path))
            return ConfigUpdate(None, None, ConfigError([where]), trigger)
        return ConfigUpdate(name, loaded, None, trigger)

    async def start(self) -> ConfigUpdate:
        """The config to start with (the same as `read`, for sources that must ask a server)."""
        return self.read(Trigger.START)

    async def updates(self) -> AsyncGenerator[ConfigUpdate, None]:
        """Every new outcome, until `stop()`; see the module doc for what counts as new.

        Once the watch is in place the path is read again, and that outcome is yielded if it
        differs from the last `read()` (a change between start-up and the watch is not lost).
        """
        tasks = TaskOwner("config-watch")
        if self._path is not None:
            tasks.spawn(self._watch(self._path), name=str(self._path), eternal=True)
        try:
            while (triggers := await self._woken()) is not None:
                changed, self._dirty = self._dirty, False
                if not triggers and not changed:
                    continue
                update = self._read(triggers[-1] if triggers else Trigger.FILE_CHANGED)
                if update.error is not None and not triggers and await self._settling():
                    continue
                seen = fingerprint(update)
                if not triggers and seen == self._last:
                    continue
                self._last = seen
                yield update
        finally:
            self._stop.set()
            # The watch only ever waits on the kernel: cancelling it is immediate.
            await tasks.close()

    async def _settling(self) -> bool:
        """True if another change or trigger arrives within the settle time."""
        try:
            await asyncio.wait_for(self._wake.wait(), self._error_settle_s)
        except TimeoutError:
            return False
        return True

    def _changed(self) -> None:
        self._dirty = True
        self._wake.set()

    async def _watch(self, path: Path) -> None:
        """Watch `path` through the right directory until cancelled; re-aim when it moves."""
        delay = _RETRY_MIN_S
        while True:
            target, relevant = _watch_target(path)
            try:
                async with DirectoryWatch(target, debounce_s=self._debounce_s) as watch:
                    # Whatever happened while no watch was in place must not be missed: read
                    # again, now that the watch is armed.
                    self._changed()
                    while _watch_target(path)[0] == target:
                        changes = await watch.changes()
                        if any(relevant(c.path) for c in changes):
                            self._changed()
                delay = _RETRY_MIN_S  # the path appeared, vanished or changed kind: aim again
            except DirectoryGone:
                delay = _RETRY_MIN_S
            except OSError as exc:
                # inotify limits, a directory removed between choosing and watching it, ...
                log.warning(
                    "cannot watch %s for config changes (%s); retrying in %.1fs",
                    target,
                    exc,
                    delay,
                )
                self._changed()
                await asyncio.sleep(delay)
                delay = min(delay * 2, _RETRY_MAX_S)


def _watch_target(path: Path) -> tuple[Path, Callable[[Path], bool]]:
    """The directory to watch for `path`, and which changed paths in it matter.

    A directory (a mounted ConfigMap) is watched itself and every change in it counts. A file
    is watched through its parent: its own name counts, and so do kubelet's `..` entries, since
    a file inside a ConfigMap volume is a symlink through `..data`.
    """
    if path.is_dir():
        return path, lambda changed: True
    if path.parent.is_dir():
        name = path.name
        return path.parent, lambda changed: changed.name == name or changed.name.startswith("..")
    ancestor = path.parent
    while not ancestor.is_dir() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    return ancestor, lambda changed: changed == path or changed in path.parents
