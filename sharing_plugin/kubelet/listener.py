"""One listening device plugin server of a resource: its grpc.aio server, servicer and socket file,
and how it closes within a bound whatever its clients do."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import grpc

from sharing_plugin.kit import unix_grpc
from sharing_plugin.kubelet.servicer import DevicePluginServicer

log = logging.getLogger(__name__)

# Bounded so that SIGTERM -> exit stays within 2 s with every resource stopping at once: the
# calls that can finish get STOP_GRACE_S, grpc's shutdown after them SHUTDOWN_BOUND_S (twice
# that when it was graceful and had to cancel at the end).
SHUTDOWN_BOUND_S = 0.1


class Listener:
    """One started grpc.aio server, its servicer and its socket file."""

    def __init__(
        self,
        server: grpc.aio.Server,
        servicer: DevicePluginServicer,
        path: Path,
        lingering: set[asyncio.Task[None]],
    ) -> None:
        self.server = server
        self.servicer = servicer
        self.path = path
        self._lingering = lingering

    async def close(self, final: bytes | None) -> None:
        """Send `final` (when given) on every stream, end them, stop serving, delete the socket.

        Returns within STOP_GRACE_S + 2 x SHUTDOWN_BOUND_S whatever the clients do. grpc cannot
        finish shutting down while a connection has a write its peer never reads (a frozen
        process with its window open); that shutdown goes on in `lingering` until the peer
        reads or goes, and nothing of ours waits for it.
        """
        # Ending our streams first lets the server stop as soon as the calls that can finish
        # have, instead of waiting out a grace period on streams that never end by themselves.
        self.servicer.broadcast(final, final=True)
        await self.servicer.wait_calls_ended(unix_grpc.STOP_GRACE_S)
        if self.servicer.unfinished():
            # Streams whose readers do not read: cancelled now.
            shutdown, bound = asyncio.ensure_future(self.server.stop(None)), SHUTDOWN_BOUND_S
        else:
            # A graceful shutdown (GOAWAY without an error) once nothing is left to finish.
            stopping = self.server.stop(SHUTDOWN_BOUND_S)
            shutdown, bound = asyncio.ensure_future(stopping), 2 * SHUTDOWN_BOUND_S
        self._lingering.add(shutdown)
        shutdown.add_done_callback(self._lingering.discard)
        done, _ = await asyncio.wait({shutdown}, timeout=bound)
        # Our name is unique, so this never removes a file kubelet created after a restart.
        self.path.unlink(missing_ok=True)
        if not done:
            log.warning(
                "a client of %s does not read what was sent to it: its connection keeps the "
                "stopped server's resources until it reads or disconnects",
                self.path.name,
            )
            return
        # grpc's tasks for the calls it cancelled resume a moment after its shutdown.
        calls = self.servicer.unfinished()
        if calls:
            await asyncio.wait(calls, timeout=SHUTDOWN_BOUND_S)
        await asyncio.sleep(0)
