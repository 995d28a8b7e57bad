"""The plugin's view of one resource's control daemon: its state file, watched through inotify.

`watch_record` follows `<mpsRoot>/<resource>/daemon.json` and calls back whenever what it says
changes: the control side rewrites it the moment its daemon dies or comes back (it learns of a
death from the kernel), so the plugin hears of it within milliseconds, with nothing running in
between. A record not confirmed for `STALE_HEARTBEATS` heartbeats is stale: the control side is
gone (its container stopped) and nobody vouches for the daemon any more, so its devices must
not be offered; one timer, armed at each confirmation, says so. A missing directory is waited
for (watching its nearest existing ancestor), so `run` can start before `mps-control`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sharing_plugin.kit.fswatch import DirectoryGone, DirectoryWatch
from sharing_plugin.mps.record import RECORD_FILE, DaemonRecord, read_record

log = logging.getLogger(__name__)

STALE_HEARTBEATS = 3
_RETRY_S = 5.0


@dataclass(frozen=True, slots=True)
class RecordView:
    """What the plugin knows of one resource's daemon."""

    resource: str
    record: DaemonRecord | None
    stale: bool = False

    @property
    def serving(self) -> bool:
        """Whether clients can use the daemon now: its devices may be Healthy."""
        return self.record is not None and self.record.state.serving and not self.stale

    @property
    def state(self) -> str:
        if self.record is None:
            return "absent"
        return "stale" if self.stale else self.record.state.value

    def key(self) -> tuple[Any, ...]:
        """What matters to the plugin: everything but the confirmation time."""
        r = self.record
        if r is None:
            return (None, self.stale)
        limits = tuple(sorted((k, repr(v)) for k, v in r.limits.items()))
        return (r.state, r.pid, r.fingerprint, limits, r.restarts, r.reason, self.stale)

    def to_status(self) -> dict[str, Any]:
        """The `/status` entry of this resource's daemon."""
        r = self.record
        reason = r.reason if r is not None else "no mps-control has written its state yet"
        if self.stale and r is not None:
            reason = f"not confirmed for {STALE_HEARTBEATS} heartbeats: is mps-control running?"
        return {
            "state": self.state,
            "pid": r.pid if r is not None else None,
            "limits": r.limits if r is not None else {},
            "restarts": r.restarts if r is not None else 0,
            "reason": reason,
        }


def current_view(resource: str, root: Path) -> RecordView:
    """What the state file in `root` says now (to start from before the watch reports)."""
    record = read_record(root)
    remaining = _remaining(record)
    return RecordView(resource, record, remaining is not None and remaining <= 0)


def _existing_ancestor(path: Path) -> Path:
    while not path.is_dir() and path != path.parent:
        path = path.parent
    return path


async def _appeared(root: Path, debounce_s: float) -> None:
    """Return once `root` is a directory, woken by the watch of its nearest existing ancestor.

    `run` may start before `mps-control` has made the directory, and makes none itself: the
    host directory belongs to the control side."""
    while (ancestor := _existing_ancestor(root)) != root:
        async with DirectoryWatch(ancestor, debounce_s=debounce_s) as watch:
            if _existing_ancestor(root) != ancestor:  # appeared while the watch was armed
                continue
            await watch.changes()


def _remaining(record: DaemonRecord | None) -> float | None:
    """Seconds until `record` goes stale; None when it cannot (no record)."""
    if record is None:
        return None
    return STALE_HEARTBEATS * record.heartbeat_s - (time.time() - record.updated_at)


async def watch_record(
    resource: str,
    root: Path,
    on_view: Callable[[RecordView], Awaitable[None]],
    *,
    debounce_s: float = 0.005,
) -> None:
    """Call `on_view` with the daemon's view now and at every change; runs until cancelled."""
    last: tuple[Any, ...] | None = None

    async def publish(view: RecordView) -> None:
        nonlocal last
        if view.key() != last:
            last = view.key()
            await on_view(view)

    while True:
        try:
            if _existing_ancestor(root) != root:
                await publish(RecordView(resource, None))
                await _appeared(root, debounce_s)
            async with DirectoryWatch(root, debounce_s=debounce_s, max_batch_s=0.05) as watch:
                record = read_record(root)
                while True:
                    remaining = _remaining(record)
                    stale = remaining is not None and remaining <= 0
                    await publish(RecordView(resource, record, stale))
                    try:
                        async with asyncio.timeout(
                            None if remaining is None or remaining <= 0 else remaining
                        ):
                            changes = await watch.changes()
                    except TimeoutError:
                        continue  # now stale: published at the top of the loop
                    if any(c.path.name == RECORD_FILE or c.path == root for c in changes):
                        record = read_record(root)
        except DirectoryGone:  # removed under us: waited for again at the top of the loop
            await publish(RecordView(resource, None))
        except OSError as exc:
            log.warning("watching MPS state in %s: %s; trying again in %.0fs", root, exc, _RETRY_S)
            await publish(RecordView(resource, None))
            await asyncio.sleep(_RETRY_S)
