"""Reading `<proc root>/<pid>/cgroup`: which pod each GPU process belongs to.

NVML reports processes by their pid in the host's pid namespace, so the proc root must show
the host's processes (`run --proc-root`: the host's `/proc` mounted into the plugin's pod, or
`/proc` itself with `hostPID`). A pid that is not there (not visible, or gone since NVML listed
it) is simply left out: the attribution then falls back to PodResources.

A process stays in its cgroup for its life, so each pid's answer is kept while NVML keeps
listing the pid and forgotten once it does not: a scrape of 384 processes reads only the
new ones. Blocking file reads: call `cgroups` from a worker thread.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from pathlib import Path

from sharing_plugin.usage.cgroup import parse_cgroup
from sharing_plugin.usage.model import CgroupRef

_MAX_BYTES = 64 * 1024  # a cgroup file is a few lines; never read a huge one whole


class CgroupReader:
    """Pid -> the pod its cgroup names (None: a process in no pod), with the cache above."""

    def __init__(self, proc_root: Path) -> None:
        self.proc_root = proc_root
        self._known: dict[int, CgroupRef | None] = {}
        self._lock = threading.Lock()

    def cgroups(self, pids: Iterable[int]) -> dict[int, CgroupRef | None]:
        """The readable ones of `pids`; the cache keeps exactly these."""
        with self._lock:
            known: dict[int, CgroupRef | None] = {}
            for pid in set(pids):
                if pid in self._known:
                    known[pid] = self._known[pid]
                    continue
                text = self._read(pid)
                if text is not None:
                    known[pid] = parse_cgroup(text)
            self._known = known
            return dict(known)

    def _read(self, pid: int) -> str | None:
        try:
            with (self.proc_root / str(pid) / "cgroup").open("rb") as f:
                return f.read(_MAX_BYTES).decode("utf-8", errors="replace")
        except OSError:  # gone, not visible in this pid namespace, or not permitted
            return None
