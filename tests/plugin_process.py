"""`sharing-plugin run` as a real child process, for end-to-end tests and benchmarks.

    async with PluginProcess(["--config", path, ...]) as plugin:
        ...                      # plugin.pid, plugin.stderr_lines (collected as they arrive)
        code = await plugin.stop()   # SIGTERM, then the exit code

The child's stderr is read continuously: a log pipe nobody drains fills up (64 KiB) and blocks
the daemon's event loop on its next log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import Mapping, Sequence
from types import TracebackType

from cli_capture import RUN_ENV_VARS


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in RUN_ENV_VARS}
    env.update(extra or {})
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def http_get(port: int, path: str) -> tuple[int, dict[str, str], bytes]:
    """One GET over a fresh connection: (status, lower-cased headers, body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        await writer.drain()
        raw = await reader.read()
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        key, _, value = line.partition(":")
        headers[key.strip().lower()] = value.strip()
    return status, headers, body


class PluginProcess:
    """`python -m sharing_plugin COMMAND ARGS` (`run` unless told) with `env`; killed on exit
    if still running."""

    def __init__(
        self,
        args: Sequence[str],
        env: Mapping[str, str] | None = None,
        *,
        command: str = "run",
    ) -> None:
        self.args = [sys.executable, "-m", "sharing_plugin", command, *args]
        self.env = child_env(env)
        self.stderr_lines: list[str] = []
        self._new_line: asyncio.Event | None = None
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    @property
    def process(self) -> asyncio.subprocess.Process:
        assert self._process is not None, "not started"
        return self._process

    @property
    def pid(self) -> int:
        return self.process.pid

    async def start(self) -> None:
        self._new_line = asyncio.Event()
        self._process = await asyncio.create_subprocess_exec(
            *self.args,
            env=self.env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        self._reader = asyncio.create_task(self._read_stderr(), name="plugin-stderr")

    async def _read_stderr(self) -> None:
        stream = self.process.stderr
        assert stream is not None
        async for line in stream:
            self.stderr_lines.append(line.decode("utf-8", "replace").rstrip("\n"))
            assert self._new_line is not None
            self._new_line.set()

    async def wait_for_line(self, text: str, timeout: float = 10.0) -> str:  # noqa: ASYNC109
        """The first stderr line containing `text`, once it has been written."""
        assert self._new_line is not None, "not started"
        async with asyncio.timeout(timeout):
            while True:
                self._new_line.clear()
                found = next((line for line in self.stderr_lines if text in line), None)
                if found is not None:
                    return found
                await self._new_line.wait()

    async def wait(self, timeout: float) -> int:  # noqa: ASYNC109 -- a bound, as in the tests
        code = await asyncio.wait_for(self.process.wait(), timeout)
        if self._reader is not None:
            await asyncio.wait_for(self._reader, timeout)
        return code

    async def stop(self, sig: int = signal.SIGTERM, timeout: float = 2.0) -> int:  # noqa: ASYNC109
        """Send `sig`; the exit code once the process ended (TimeoutError if it did not)."""
        self.process.send_signal(sig)
        return await self.wait(timeout)

    def stderr(self) -> str:
        return "\n".join(self.stderr_lines)

    async def __aenter__(self) -> PluginProcess:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._process is not None and self._process.returncode is None:
            self._process.kill()
            await self._process.wait()
        if self._reader is not None:
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(self._reader, 2.0)
