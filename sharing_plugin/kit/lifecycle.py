"""The lifecycle of every long-running part of the process: start in order, always close.

A `Service` is an async context manager over its own `start()` and `close()`. A start that
fails half-way (the second of two sockets cannot be bound, a cancellation while waiting for a
thread) leaves whatever it had started running unless something closes it, and the caller of a
failed `async with` never gets to `__aexit__`: so entering closes on a failed start before the
error goes on, and `close()` must cope with a start that stopped anywhere.
"""

from __future__ import annotations

from collections.abc import Collection
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

if TYPE_CHECKING:
    import asyncio

__all__ = ["Service"]


class Service:
    """An async context manager that starts in order and always closes, a failed start too."""

    async def start(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    def held_up(self) -> Collection[asyncio.Task[Any]]:
        """What a closed service leaves running because a peer holds it up (a grpc server's
        shutdown that a client which does not read holds): none unless a service says so."""
        return ()

    async def __aenter__(self) -> Self:
        try:
            await self.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
