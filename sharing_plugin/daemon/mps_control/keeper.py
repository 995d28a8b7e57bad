"""One resource's MPS control daemon, kept running with its limits: start, adopt, restart.

A `DaemonKeeper` owns the daemon of one `MpsDaemon` value. At start it adopts a daemon already
serving that resource with the same GPUs and limits (the state file's fingerprint and pid match,
and it answers): restarting `mps-control` must not kill the clients of a daemon that is fine.
Otherwise it stops whatever daemon holds the pipe directory, starts one for the resource's GPUs
and sets the limits, then waits for its death (the kernel tells, through a pidfd) or for the
next heartbeat, at which it asks the daemon and confirms the state file. A daemon that dies or
stops answering is restarted with backoff (0.2 s doubling to 10 s, back to 0.2 s once a daemon
stayed up for `stable_s`); each state change is written to the state file at once, which is how
the plugin learns to advertise the resource's devices as Unhealthy within a second.

A multi-user daemon (`-M`) gets directories every UID can reach before it starts; a daemon
that is no longer multi-user gets them closed again, so toggling the key back is complete.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from sharing_plugin.errors import MpsError
from sharing_plugin.mps import (
    DaemonRecord,
    DaemonState,
    MpsControl,
    process_alive,
    read_record,
    remove_record,
    wait_exit,
    write_record,
)
from sharing_plugin.mps.control import (
    GET_SERVER_LIST,
    QUIT,
    set_default_active_thread_percentage,
    set_default_device_pinned_mem_limit,
)
from sharing_plugin.plan.mps import (
    LOG,
    MULTI_USER_MODES,
    MULTI_USER_ROOT_MODE,
    PIPE,
    SHM,
    MpsDaemon,
)

log = logging.getLogger(__name__)

_QUIT_WAIT_S = 5.0
_SINGLE_USER_MODE = 0o755


@dataclass(frozen=True, slots=True)
class KeeperTiming:
    """How often the daemon is asked, and how restarts back off."""

    heartbeat_s: float = 10.0
    backoff_s: tuple[float, float] = (0.2, 10.0)
    stable_s: float = 10.0  # up this long: the next restart starts from the first delay again


class DaemonKeeper:
    """Keeps the control daemon of `spec` running; `run()` until cancelled."""

    def __init__(self, spec: MpsDaemon, *, control: MpsControl, timing: KeeperTiming) -> None:
        self.spec = spec
        self.root = Path(spec.root)
        self.pipe = Path(spec.pipe_directory)
        self._control = control
        self._timing = timing
        self.restarts = 0
        self.pid: int | None = None
        self.state = DaemonState.STARTING
        self._reason: str | None = None
        self._waiting: str | None = None

    # --- what the controller asks ------------------------------------------------------------

    def set_waiting(self, reason: str | None) -> None:
        """Show (or clear) a change that waits for pods; the daemon keeps serving meanwhile."""
        if reason == self._waiting:
            return
        self._waiting = reason
        if self.state.serving:
            self._write(DaemonState.WAITING if reason else DaemonState.READY, reason)

    async def retire(self) -> None:
        """Stop the daemon for good (its resource is gone) and remove its state file."""
        await self._stop_running(self.pid, why="its resource is no longer shared through MPS")
        remove_record(self.root)

    # --- the loop ----------------------------------------------------------------------------

    async def run(self) -> None:
        first, limit = self._timing.backoff_s
        delay = first
        adopted = await self._adopt()
        loop = asyncio.get_running_loop()
        while True:
            if not adopted:
                try:
                    await self._start()
                except MpsError as exc:
                    log.error(
                        "MPS daemon for %s: %s; retrying in %.1fs", self.spec.resource, exc, delay
                    )
                    self._write(DaemonState.FAILED, str(exc))
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, limit)
                    continue
            adopted = False
            started = loop.time()
            cause = await self._serve()
            self.restarts += 1
            if loop.time() - started >= self._timing.stable_s:
                delay = first
            log.warning(
                "MPS daemon for %s: %s; restarting in %.1fs (restart %d)",
                self.spec.resource,
                cause,
                delay,
                self.restarts,
            )
            self._write(DaemonState.RESTARTING, cause)
            await asyncio.sleep(delay)
            delay = min(delay * 2, limit)

    async def _adopt(self) -> bool:
        record = read_record(self.root)
        if record is not None:
            self.restarts = record.restarts  # the count belongs to the resource, not the process
        pid = self._control.daemon_pid(self.pipe)
        if (
            record is None
            or pid is None
            or record.pid != pid
            or record.fingerprint != self.spec.fingerprint
            or not process_alive(pid)
        ):
            return False
        try:
            await self._control.send(self.pipe, [GET_SERVER_LIST])
        except MpsError as exc:
            log.info("MPS daemon for %s (pid %d) does not answer: %s", self.spec.resource, pid, exc)
            return False
        self.pid = pid
        log.info("MPS daemon for %s: adopted the running daemon (pid %d)", self.spec.resource, pid)
        self._write_serving()
        return True

    async def _start(self) -> None:
        spec = self.spec
        await asyncio.to_thread(_make_dirs, spec)
        leftover = self._control.daemon_pid(self.pipe)
        if leftover is not None and process_alive(leftover):
            await self._stop_running(leftover, why="it was started for other GPUs or limits")
        self.pid = None
        self._write(DaemonState.STARTING, None)
        await self._control.start_daemon(
            pipe_directory=self.pipe,
            log_directory=Path(spec.log_directory),
            devices=spec.gpus,
            multi_user=spec.multi_user,
        )
        self.pid = self._control.daemon_pid(self.pipe)
        commands = [
            *(
                set_default_device_pinned_mem_limit(ordinal, device.pinned_memory_limit)
                for ordinal, device in enumerate(spec.devices)
            ),
            set_default_active_thread_percentage(spec.active_thread_percentage),
        ]
        try:
            await self._control.send(self.pipe, commands)
        except MpsError:
            # A daemon without its limits would let one client take a whole GPU.
            await self._stop_running(self.pid, why="its limits could not be set")
            raise
        log.info(
            "MPS daemon for %s started (pid %s%s) on %d GPU(s): %d%% threads, pinned memory %s",
            spec.resource,
            self.pid,
            ", multi-user" if spec.multi_user else "",
            len(spec.devices),
            spec.active_thread_percentage,
            ", ".join(d.pinned_memory_limit for d in spec.devices),
        )
        self._write_serving()

    async def _serve(self) -> str:
        """Return why the daemon stopped serving, once it has."""
        pid = self.pid
        while True:
            try:
                async with asyncio.timeout(self._timing.heartbeat_s):
                    if pid is None:  # no pid file: the heartbeat's question is all there is
                        await asyncio.Event().wait()
                    else:
                        await wait_exit(pid)
                return f"the daemon (pid {pid}) exited"
            except TimeoutError:
                pass
            try:
                await self._control.send(self.pipe, [GET_SERVER_LIST])
            except MpsError as exc:
                if pid is not None and process_alive(pid):
                    _kill(pid)
                return f"the daemon (pid {pid}) does not answer: {exc}"
            self._write_serving()

    async def _stop_running(self, pid: int | None, *, why: str) -> None:
        if pid is None or not process_alive(pid):
            return
        log.info("stopping the MPS daemon in %s (pid %d): %s", self.pipe, pid, why)
        try:
            await self._control.send(self.pipe, [QUIT])
            async with asyncio.timeout(_QUIT_WAIT_S):
                await wait_exit(pid)
            return
        except (MpsError, TimeoutError) as exc:
            log.warning("MPS daemon pid %d did not quit (%s): killing it", pid, exc)
        _kill(pid)
        async with asyncio.timeout(_QUIT_WAIT_S):
            await wait_exit(pid)

    # --- the state file ----------------------------------------------------------------------

    def _write_serving(self) -> None:
        waiting = self._waiting
        self._write(DaemonState.WAITING if waiting else DaemonState.READY, waiting)

    def _write(self, state: DaemonState, reason: str | None) -> None:
        self.state = state
        self._reason = reason
        write_record(
            self.root,
            DaemonRecord(
                resource=self.spec.resource,
                state=state,
                fingerprint=self.spec.fingerprint,
                pid=self.pid if state.serving else None,
                limits=self.spec.limits(),
                restarts=self.restarts,
                reason=reason,
                heartbeat_s=self._timing.heartbeat_s,
                updated_at=time.time(),
            ),
        )


def _make_dirs(spec: MpsDaemon) -> None:
    pipe, logs = Path(spec.pipe_directory), Path(spec.log_directory)
    for directory in (pipe, logs):
        directory.mkdir(parents=True, exist_ok=True)
    if spec.multi_user:
        # mkdir's mode passes through the umask: the bits are set explicitly.
        root = Path(spec.root)
        root.chmod(root.stat().st_mode & 0o7777 | MULTI_USER_ROOT_MODE)
        shm = Path(spec.shm_directory)
        shm.mkdir(parents=True, exist_ok=True)
        for directory, mode in ((pipe, MULTI_USER_MODES[PIPE]), (logs, MULTI_USER_MODES[LOG])):
            directory.chmod(mode)
        shm.chmod(MULTI_USER_MODES[SHM])
        return
    for directory, mode in ((pipe, MULTI_USER_MODES[PIPE]), (logs, MULTI_USER_MODES[LOG])):
        if directory.stat().st_mode & 0o7777 == mode:  # opened for a multi-user daemon before
            directory.chmod(_SINGLE_USER_MODE)


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
