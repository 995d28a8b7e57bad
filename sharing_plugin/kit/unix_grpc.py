"""gRPC served on a unix socket, as the kubelet wants every plugin socket.

An AF_UNIX address holds 107 bytes of path (108 with the terminating NUL): a longer path cannot
be bound or dialled, so it is refused up front with what to shorten. A process that was killed
leaves its socket file behind; `probe` tells such a stale socket (nobody listens: remove it)
from a live one (a running instance: never touch it). A server is listened on only once its
socket answers a call of its own, so the kubelet is never told of a socket that refuses it.
Errors are `KubeletError`: every unix socket of the plugin faces the kubelet.
"""

from __future__ import annotations

import enum
import os
import socket
import stat
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import grpc

from sharing_plugin.errors import KubeletError

__all__ = [
    "MAX_SOCKET_PATH_BYTES",
    "READY_TIMEOUT_S",
    "STOP_GRACE_S",
    "Context",
    "SocketState",
    "check_answers",
    "check_socket_path",
    "probe",
    "serve",
    "socket_path_bytes",
]

# AF_UNIX sun_path holds 108 bytes including the terminating NUL.
MAX_SOCKET_PATH_BYTES = 107
# How long a fresh server may take to answer on its own socket.
READY_TIMEOUT_S = 2.0
# How long the calls that can still finish get when a server stops: short, so that SIGTERM ->
# exit stays within 2 s with every server stopping at once.
STOP_GRACE_S = 0.5

# What a servicer's method is handed (grpc's stubs leave its request and response types open).
Context = grpc.aio.ServicerContext[Any, Any]


def socket_path_bytes(path: Path) -> int:
    return len(str(path).encode())


def check_socket_path(
    path: Path, *, advice: str, what: str | None = None, shown: object = None
) -> None:
    """Raise KubeletError when `path` does not fit a unix socket address.

    The message names the path (as `shown`, when the real name is not the admin's to see), what
    it is, its size and `advice`: what the admin can shorten.
    """
    size = socket_path_bytes(path)
    if size > MAX_SOCKET_PATH_BYTES:
        named = f"{shown if shown is not None else path}{f' ({what})' if what else ''}"
        raise KubeletError(
            f"socket path {named} is {size} bytes, over the {MAX_SOCKET_PATH_BYTES}-byte limit "
            f"of a unix socket path: {advice}"
        )


class SocketState(enum.Enum):
    MISSING = "missing"
    NOT_A_SOCKET = "not a socket"
    STALE = "stale"  # a socket nobody listens on: what a killed process leaves
    LIVE = "live"


def probe(path: Path) -> SocketState:
    """What is at `path`, without ever blocking; OSError when it cannot be looked at."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return SocketState.MISSING
    if not stat.S_ISSOCK(mode):
        return SocketState.NOT_A_SOCKET
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.setblocking(False)
        try:
            connection.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            return SocketState.STALE
        except OSError:
            # e.g. EAGAIN, a full backlog: someone listens; when unsure, keep it.
            return SocketState.LIVE
        return SocketState.LIVE


async def serve(
    path: Path,
    add_services: Callable[[grpc.aio.Server], None],
    *,
    options: Sequence[tuple[str, Any]] = (),
    who: str | None = None,
    advice: str | None = None,
) -> grpc.aio.Server:
    """A started grpc.aio server with `add_services` on the unix socket `path`.

    KubeletError when the socket cannot be bound: it names `who` listens and `advice`.
    """
    server = grpc.aio.server(options=options)
    add_services(server)
    try:
        server.add_insecure_port(f"unix://{path}")
    except RuntimeError as exc:
        raise KubeletError(
            f"cannot listen{f' for {who}' if who else ''} on {path}: {exc}"
            f"{f'; {advice}' if advice else ''}"
        ) from exc
    await server.start()
    return server


async def check_answers(
    path: Path, call: Callable[[grpc.aio.Channel], Awaitable[object]], *, who: str
) -> None:
    """Dial `path` and make `call` on it (which waits for readiness within READY_TIMEOUT_S);
    KubeletError, saying that `who` does not answer, when it fails."""
    async with grpc.aio.insecure_channel(
        f"unix://{path}", options=[("grpc.default_authority", "localhost")]
    ) as channel:
        try:
            await call(channel)
        except grpc.aio.AioRpcError as exc:
            raise KubeletError(
                f"{who} does not answer on its own socket {path}: "
                f"{exc.code().name}: {exc.details()}"
            ) from exc
