"""Event sets and injected faults of the simulated NVML.

An event set queues events for the GPUs registered on it and wakes a waiter at once, like
``nvmlEventSetWait``. Faults come from the node file's `faults` list: entries appended while a
process runs are delivered once. The file is watched (inotify, woken by the kernel only) while any
event set exists, so an append wakes a waiter within milliseconds; the watch is in place before
the event set that starts it is returned, so no append after that can be missed, and its
size/mtime is also checked whenever a waiter starts waiting. Nothing polls on a timer. Entries
appended while no event set existed (the watch is off) are caught up when watching starts
again: a lost GPU is state and applies, but an Xid or ECC error is gone, since NVML queues
events only for the event sets registered when they happen.
"""

from __future__ import annotations

import collections
import logging
import os
import select
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pynvml
from asyncinotify import Inotify, Mask

from sharing_plugin.nvml.api import DeviceHandle
from sharing_plugin.sim.nvml.node import Fault, read_faults
from sharing_plugin.sim.nvml.workload import file_stamp

log = logging.getLogger(__name__)

_CHANGED = Mask.CREATE | Mask.MOVED_TO | Mask.CLOSE_WRITE | Mask.MODIFY | Mask.ONLYDIR


class _Stop:
    """Tells one watcher thread to end: a pipe its select() wakes on, set from any thread."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        self._lock = threading.Lock()
        self._set = False

    def fileno(self) -> int:
        return self._read

    def set(self) -> None:
        with self._lock:
            if not self._set:
                self._set = True
                os.write(self._write, b"x")
                os.close(self._write)

    def close(self) -> None:
        """The watcher's end, when it leaves."""
        self.set()
        os.close(self._read)


@dataclass(frozen=True, slots=True)
class SimEventData:
    """What ``nvmlEventSetWait_v2`` returns (c_nvmlEventData_t's fields)."""

    device: DeviceHandle  # the GPU it happened on
    eventType: int
    eventData: int
    gpuInstanceId: int
    computeInstanceId: int


class SimEventSet:
    """An NVML event set: registered GPUs and the events not yet waited for."""

    def __init__(self, on_wait: Callable[[], None]) -> None:
        self._cond = threading.Condition()
        self._queue: collections.deque[SimEventData] = collections.deque()
        self._masks: dict[int, int] = {}  # GPU index -> registered event types
        self._on_wait = on_wait
        self.freed = False

    def register(self, gpu_index: int, mask: int) -> None:
        with self._cond:
            self._masks[gpu_index] = self._masks.get(gpu_index, 0) | mask

    def offer(self, gpu_index: int, event: SimEventData) -> None:
        """Queue `event` if this set listens for its type on that GPU."""
        with self._cond:
            if self._masks.get(gpu_index, 0) & event.eventType and not self.freed:
                self._queue.append(event)
                self._cond.notify_all()

    def wait(self, timeout_ms: int) -> SimEventData:
        self._on_wait()
        with self._cond:
            if not self._cond.wait_for(lambda: bool(self._queue), timeout=timeout_ms / 1000):
                raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
            return self._queue.popleft()


class FaultFeed:
    """Follows a node file's `faults` list and hands each newly appended entry to `deliver`.

    Watches while it has users: each event set calls `start` when created and `stop` when
    freed. Event sets of a closed watch are freed by its thread whenever its last wait returns,
    possibly while a new watch creates its own, so the count is kept under a lock and a stop
    never waits for the watcher thread: it is told to end, and a start right after begins a new
    one (both only deliver entries they claim under the lock, so nothing arrives twice).
    """

    def __init__(
        self, path: Path, initial: tuple[Fault, ...], deliver: Callable[[Fault], None]
    ) -> None:
        self._path = path
        self._seen = len(initial)
        self._deliver = deliver
        self._lock = threading.Lock()
        self._stamp = file_stamp(self._path)
        self._users_lock = threading.Lock()
        self._users = 0
        self._stop: _Stop | None = None  # the running watcher's

    def start(self) -> None:
        """One more user; the first starts watching, catching up with what changed while
        stopped."""
        with self._users_lock:
            self._users += 1
            if self._users > 1:
                return
            stop = self._stop = _Stop()
        # Watching before returning: an append right after the event set exists must wake it
        # (a waiter may sit in one wait for seconds), not wait for a thread to get going.
        inotify = Inotify(sync_timeout=0)
        try:
            inotify.add_watch(self._path.parent, _CHANGED)
        except Exception:
            inotify.close()
            stop.close()
            raise
        for fault in self._new_faults():
            if fault.lost is not None:
                self._deliver(fault)
        threading.Thread(
            target=self._watch,
            args=(inotify, stop),
            name=f"simulated-nvml-faults:{self._path.name}",
            daemon=True,
        ).start()

    def stop(self) -> None:
        """One user fewer; the last one's leaving wakes the watcher, which ends."""
        with self._users_lock:
            self._users = max(self._users - 1, 0)
            if self._users == 0 and self._stop is not None:
                self._stop.set()

    def check(self) -> None:
        """Re-read the file if it changed since last time and deliver new entries."""
        for fault in self._new_faults():
            self._deliver(fault)

    def _new_faults(self) -> tuple[Fault, ...]:
        stamp = file_stamp(self._path)
        with self._lock:
            if stamp == self._stamp:
                return ()
            faults = read_faults(self._path)
            if faults is None:
                return ()  # half-written: look again at the next change
            self._stamp = stamp
            new = faults[self._seen :] if len(faults) >= self._seen else ()
            self._seen = len(faults)  # a shortened list is a rewrite, not new faults
        return new

    def _watch(self, inotify: Inotify, stop: _Stop) -> None:
        # The parent directory is watched, not the file: editors and ConfigMap updates replace
        # the file by renaming, which ends a watch held on the old inode. The thread sleeps in
        # select() on the inotify descriptor and the stop pipe: no step, no timer.
        name = self._path.name
        try:
            with inotify:
                while True:
                    ready, _, _ = select.select([inotify.fd, stop.fileno()], [], [])
                    if stop.fileno() in ready:
                        return
                    names = set()
                    while (event := inotify.sync_get()) is not None:
                        names.add(event.name)
                    if Path(name) in names:
                        self.check()
        except Exception:  # the feed must not die silently: waiters still check on each wait
            log.exception("simulated NVML: watching %s for faults failed", self._path)
        finally:
            stop.close()
