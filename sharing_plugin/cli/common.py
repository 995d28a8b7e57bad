"""What every command shares: exit codes, on/off flags, and flags that also read env vars."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Protocol, Self

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_USAGE = 2
STDIN = "-"

Flag = tuple[str, str, str | None, str]
"""(flag, env var, default, help): a flag that also reads an env var, as the DaemonSet sets it."""


def add_env_flags(parser: argparse.ArgumentParser, flags: Sequence[Flag]) -> None:
    for flag, env, default, text in flags:
        parser.add_argument(
            flag,
            default=os.environ.get(env, default),
            metavar=flag.removeprefix("--").upper().replace("-", "_"),
            help=f"{text} (env {env}{'' if default is None else f'; default {default}'})",
        )


def on_off(flag: str, value: str) -> bool:
    word = value.strip().lower()
    if word in ("on", "true", "1", "yes"):
        return True
    if word in ("off", "false", "0", "no"):
        return False
    raise ValueError(f"{flag} must be on or off (got {value!r})")


class SignalledService(Protocol):
    """A long-running command's service: stopped by SIGTERM/SIGINT, reloaded by SIGHUP."""

    def request_stop(self) -> None: ...

    def request_reload(self) -> None: ...

    async def wait_stopped(self) -> None: ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


def serve_until_stopped(
    build: Callable[[], SignalledService], *, logger: logging.Logger, stopping: str
) -> None:
    """Run the service `build()` makes until a signal stops it; errors propagate.

    The handlers are installed before the service starts, so a signal that arrives during
    start-up stops it gracefully too, once start-up has finished. asyncio is imported here, not
    at the top, so that commands that never serve (`validate`, `plan`) do not load it.
    """
    import asyncio
    import signal

    async def serve() -> None:
        service = build()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, service.request_stop)
        loop.add_signal_handler(signal.SIGINT, service.request_stop)
        loop.add_signal_handler(signal.SIGHUP, service.request_reload)
        try:
            async with service:
                await service.wait_stopped()
                logger.info(stopping)
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(sig)

    asyncio.run(serve())
