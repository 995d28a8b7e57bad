"""A control daemon's process: is it alive, and wait for its death without polling.

`nvidia-cuda-mps-control -d` daemonises: the daemon is no child of ours, so `waitpid` cannot
tell when it dies. A pidfd (Linux 5.3) can: it becomes readable when the process exits, and
the event loop watches it like a socket, so a crash is seen at once with nothing running in
between. Where the process is our child after all (we are PID 1 of a container, and orphans
are handed to us), it is reaped, so dead daemons do not pile up as zombies.
"""

from __future__ import annotations

import asyncio
import contextlib
import os


def process_alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
            state = stat.read().rpartition(")")[2].split()
    except OSError:
        return False
    return bool(state) and state[0] != "Z"


async def wait_exit(pid: int) -> None:
    """Return once `pid` has exited (at once if it is not running)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        _reap(pid)
        return
    loop = asyncio.get_running_loop()
    exited = loop.create_future()
    try:
        loop.add_reader(fd, _settle, exited)
        try:
            if process_alive(pid):
                await exited
        finally:
            loop.remove_reader(fd)
    finally:
        os.close(fd)
    _reap(pid)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
