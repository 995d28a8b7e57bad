"""`nvidia-cuda-mps-control`, the MPS control binary, behind a typed Protocol.

The binary is the only interface MPS has: `-d` starts the control daemon in the background for
the GPUs in `CUDA_VISIBLE_DEVICES`, with its pipes in `CUDA_MPS_PIPE_DIRECTORY` and its logs in
`CUDA_MPS_LOG_DIRECTORY`; run without arguments it sends each line of its stdin to the daemon of
that pipe directory and prints the answers, exiting non-zero when there is no daemon or a
command fails. The daemon writes its pid to `nvidia-cuda-mps-control.pid` in the pipe
directory. `MpsControl` lists exactly that; `ControlBinary` is the real thing, and the tests
run it against a stand-in executable of their own, so this code is what they exercise.

`-M` (with `-d`) starts the daemon in multi-user mode: one MPS server serves clients of every
UID, where by default MPS serves the clients of one UID at a time.

The daemonising `-d` call gets files, not pipes, for its output: a daemon that kept an
inherited pipe open would make reading it wait for the daemon's death.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Protocol

from sharing_plugin.errors import MpsError

DEFAULT_BINARY = "nvidia-cuda-mps-control"
PID_FILE = "nvidia-cuda-mps-control.pid"
_TIMEOUT_S = 10.0


def set_default_active_thread_percentage(percentage: int) -> str:
    return f"set_default_active_thread_percentage {percentage}"


def set_default_device_pinned_mem_limit(device: int, limit: str) -> str:
    """`device` is the ordinal among the daemon's visible devices; `limit` e.g. ``20480M``."""
    return f"set_default_device_pinned_mem_limit {device} {limit}"


GET_SERVER_LIST = "get_server_list"
QUIT = "quit"


class MpsControl(Protocol):
    """What the plugin asks of the MPS control binary."""

    async def start_daemon(
        self,
        *,
        pipe_directory: Path,
        log_directory: Path,
        devices: Sequence[str],
        multi_user: bool = False,
    ) -> None:
        """`-d` (`-d -M` for `multi_user`): start a control daemon for `devices` (UUIDs);
        returns once it runs."""
        ...

    async def send(self, pipe_directory: Path, commands: Sequence[str]) -> str:
        """Send `commands` to the daemon of `pipe_directory`; its answers, one per line."""
        ...

    def daemon_pid(self, pipe_directory: Path) -> int | None:
        """The pid the daemon of `pipe_directory` wrote, if any (it may have died since)."""
        ...


class ControlBinary:
    """`MpsControl` by running the binary at `path` (a name is looked up on PATH)."""

    def __init__(self, path: str = DEFAULT_BINARY, *, timeout_s: float = _TIMEOUT_S) -> None:
        self.path = path
        self._timeout_s = timeout_s

    def _env(self, pipe_directory: Path, **extra: str) -> dict[str, str]:
        return {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe_directory), **extra}

    async def start_daemon(
        self,
        *,
        pipe_directory: Path,
        log_directory: Path,
        devices: Sequence[str],
        multi_user: bool = False,
    ) -> None:
        args = ("-d", "-M") if multi_user else ("-d",)
        env = self._env(
            pipe_directory,
            CUDA_MPS_LOG_DIRECTORY=str(log_directory),
            CUDA_VISIBLE_DEVICES=",".join(devices),
        )
        with tempfile.TemporaryFile() as output:
            process = await self._spawn(args, env, stdin=None, output=output)
            code = await self._wait(process, " ".join(args))
            output.seek(0)
            text = output.read().decode(errors="replace").strip()
        if code != 0:
            raise MpsError(f"{self.path} {' '.join(args)} exited {code}: {text or 'no output'}")

    async def send(self, pipe_directory: Path, commands: Sequence[str]) -> str:
        process = await self._spawn(
            (), self._env(pipe_directory), stdin=asyncio.subprocess.PIPE, output=None
        )
        lines = "".join(f"{c}\n" for c in commands).encode()
        try:
            async with asyncio.timeout(self._timeout_s):
                out, err = await process.communicate(lines)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise MpsError(
                f"{self.path}: no answer to {commands[0]!r} within {self._timeout_s:.0f}s"
            ) from None
        if process.returncode != 0:
            text = (err or out).decode(errors="replace").strip()
            raise MpsError(
                f"{self.path}: {'; '.join(commands)}: exited {process.returncode}: "
                f"{text or 'no output'}"
            )
        return out.decode(errors="replace")

    def daemon_pid(self, pipe_directory: Path) -> int | None:
        try:
            return int((pipe_directory / PID_FILE).read_text(encoding="utf-8").strip())
        except (OSError, ValueError):
            return None

    async def _spawn(
        self,
        args: tuple[str, ...],
        env: dict[str, str],
        *,
        stdin: int | None,
        output: IO[bytes] | None,
    ) -> asyncio.subprocess.Process:
        try:
            if output is None:
                return await asyncio.create_subprocess_exec(
                    self.path,
                    *args,
                    env=env,
                    stdin=stdin,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                )
            return await asyncio.create_subprocess_exec(
                self.path,
                *args,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=output,
                stderr=asyncio.subprocess.STDOUT,
            )
        except OSError as exc:
            raise MpsError(
                f"cannot run the MPS control binary {self.path!r}: {exc.strerror or exc} "
                "(install the NVIDIA driver's utilities in the image, or name it with "
                "--mps-control-bin / MPS_CONTROL_BIN)"
            ) from exc

    async def _wait(self, process: asyncio.subprocess.Process, what: str) -> int:
        try:
            async with asyncio.timeout(self._timeout_s):
                return await process.wait()
        except TimeoutError:
            process.kill()
            await process.wait()
            raise MpsError(
                f"{self.path} {what} did not return within {self._timeout_s:.0f}s"
            ) from None
