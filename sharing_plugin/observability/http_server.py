"""The metrics address: `/metrics`, `/healthz`, `/readyz` and `/status` over a tiny HTTP/1.1 server.

prometheus-client's own `start_http_server` runs in a thread and serves only `/metrics`; we also
need the JSON `/status` and the probes, on the event loop that runs the daemon, so that `/healthz`
answering really means "the loop is alive". Probes and scrapers send one small GET and read one
response, so the server speaks just that: GET (and HEAD), one request per connection,
`Content-Length`, `Connection: close`. Everything else gets a proper status code.

The server must never be the reason the plugin stops: a request that is garbage, too large, too
slow (a read timeout bounds each request) or from one of too many clients gets an error response or
a closed connection, and the next request is served as usual.

Nor the reason kubelet restarts it: past the connection cap, a connection still gets a short read
deadline and, when it asks for a probe (`/healthz`, `/readyz`), its answer; only the other paths
get 503. A cap that refused probes too would let a hundred idle connections, reconnecting as
soon as they are closed, fail the liveness probe of a healthy plugin for as long as they last.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import re
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from urllib.parse import urlsplit

from sharing_plugin.errors import MetricsServerError
from sharing_plugin.kit.lifecycle import Service
from sharing_plugin.observability.metrics import CONTENT_TYPE, Metrics
from sharing_plugin.observability.status import StatusBoard

log = logging.getLogger(__name__)

_MAX_HEADER_BYTES = 8192
_MAX_HEADER_LINES = 100
_METHOD = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 token
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*")  # RFC 1123 names and IPv4
_PATHS = "/metrics, /healthz, /readyz or /status"
# Answered past the connection cap: cheap, and what kubelet's probes ask for.
_PROBES = frozenset({"/healthz", "/readyz"})
# What is read at request time before rendering (GPU usage); a refresh stuck longer than this
# is left to finish on its own and the answer is rendered from what is there.
_REFRESHED = frozenset({"/metrics", "/status"})
_REFRESH_TIMEOUT_S = 2.0


def parse_metrics_address(text: str) -> tuple[str, int] | None:
    """`HOST:PORT`, `[IPV6]:PORT`, `:PORT` (all interfaces, host "") or `off` (None).

    Raises ValueError with a message that says what is wrong and what a valid value looks like.
    """
    value = text.strip()
    if value.lower() == "off":
        return None
    hint = "use HOST:PORT (e.g. 0.0.0.0:9400, [::]:9400, :9400) or 'off'"
    if value.startswith("["):
        host, sep, port_text = value[1:].partition("]:")
        if not sep:
            raise ValueError(
                f"metrics address {text!r}: missing ']:PORT' after an IPv6 host; {hint}"
            )
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(
                f"metrics address {text!r}: {host!r} is not an IPv6 address; {hint}"
            ) from None
    else:
        host, sep, port_text = value.rpartition(":")
        if not sep:
            raise ValueError(f"metrics address {text!r}: no port; {hint}")
        if ":" in host:
            raise ValueError(
                f"metrics address {text!r}: an IPv6 host needs brackets, e.g. [::1]:9400; {hint}"
            )
        if host and not _HOSTNAME.fullmatch(host):
            raise ValueError(f"metrics address {text!r}: {host!r} is not a host name or IP; {hint}")
    if not (port_text.isascii() and port_text.isdigit()) or not 0 <= int(port_text) <= 65535:
        raise ValueError(
            f"metrics address {text!r}: port must be a number 0-65535 (got {port_text!r}); {hint}"
        )
    return host, int(port_text)


class _BadRequest(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


class MetricsServer(Service):
    """Serves one `Metrics` and one `StatusBoard`; use as ``async with MetricsServer(...) as s``.

    `port=0` picks a free port (tests); read the bound one from `port` once started.
    """

    def __init__(
        self,
        host: str,
        port: int,
        metrics: Metrics,
        status: StatusBoard,
        *,
        read_timeout: float = 5.0,
        write_timeout: float = 5.0,
        max_connections: int = 64,
        probe_read_timeout: float = 1.0,
        refresh: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """`refresh` is awaited before `/metrics` and `/status` are rendered (bounded), so
        what is measured at request time is current in both."""
        self.host = host
        self._requested_port = port
        self.metrics = metrics
        self.status = status
        self._read_timeout = read_timeout
        self._write_timeout = write_timeout
        self._max_connections = max_connections
        # Kubelet's probe sends its request as soon as it is connected.
        self._probe_read_timeout = min(read_timeout, probe_read_timeout)
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._refresh = refresh

    @property
    def port(self) -> int:
        """The port actually bound (differs from the requested one when that was 0)."""
        if self._server is None or not self._server.sockets:
            raise RuntimeError("the metrics server is not started")
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    @property
    def url(self) -> str:
        host = self.host or "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        try:
            self._server = await asyncio.start_server(
                self._serve_connection,
                host=self.host or None,
                port=self._requested_port,
                limit=_MAX_HEADER_BYTES,
                reuse_address=True,
            )
        except OSError as exc:
            raise MetricsServerError(
                f"cannot listen on metrics address {self.host or '*'}:{self._requested_port}: "
                f"{exc.strerror or exc}; choose another --metrics-address (METRICS_ADDRESS) "
                "or set it to 'off'"
            ) from exc
        log.info("metrics and health endpoints listening on %s", self.url)

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        # Python 3.11's Server.close() leaves accepted connections open: end them ourselves so
        # shutdown is bounded even with a client stuck mid-request.
        connections = list(self._connections)
        for task in connections:
            task.cancel()
        await asyncio.gather(*connections, return_exceptions=True)
        await server.wait_closed()

    # --- one connection ----------------------------------------------------------------------

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        if self._server is None:  # accepted just before close(): not ours to answer any more
            writer.close()
            return
        self._connections.add(task)
        try:
            if await self._exchange(reader, writer):
                await self._discard_input(reader, writer)
        except asyncio.CancelledError:
            # close() cancels connections stuck mid-request. Python 3.11's stream callback logs a
            # handler that ends cancelled as an error, so end normally: nobody awaits this task.
            pass
        except (ConnectionError, TimeoutError):
            pass  # the client went away or stopped reading; nothing to tell it
        except Exception:
            log.exception("metrics server: unexpected error while answering a request")
        finally:
            self._connections.discard(task)
            writer.close()

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; True when the client may still be sending bytes we did not read."""
        over_cap = len(self._connections) > self._max_connections
        try:
            async with asyncio.timeout(
                self._probe_read_timeout if over_cap else self._read_timeout
            ):
                method, path, has_body = await self._read_request(reader)
        except _BadRequest as bad:
            await self._send(writer, bad.status, f"{bad}\n")
            return True
        except TimeoutError:
            await self._send(writer, HTTPStatus.REQUEST_TIMEOUT, "request not received in time\n")
            return True
        except asyncio.IncompleteReadError:
            return False  # the client went away before finishing its request
        if over_cap and path not in _PROBES:
            await self._send(writer, HTTPStatus.SERVICE_UNAVAILABLE, "too many connections\n")
            return has_body
        await self._answer(writer, method, path)
        return has_body

    async def _discard_input(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Read what the client still sends before closing, briefly.

        Closing a TCP socket with unread input makes the kernel send RST, and a client that gets
        the RST before reading our answer sees "connection reset" instead of the 4xx/503 that says
        what was wrong (the "lingering close" of RFC 9112 9.6).
        """
        if writer.can_write_eof():
            writer.write_eof()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(min(self._read_timeout, 1.0)):
                for _ in range(16):
                    if not await reader.read(65536):
                        break

    async def _read_request(self, reader: asyncio.StreamReader) -> tuple[str, str, bool]:
        """(method, path, whether a body follows the header)."""
        lines: list[bytes] = []
        total = 0
        while True:
            try:
                line = await reader.readuntil(b"\n")
            except asyncio.LimitOverrunError:
                raise _BadRequest(
                    HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "request header too large"
                ) from None
            total += len(line)
            if total > _MAX_HEADER_BYTES or len(lines) > _MAX_HEADER_LINES:
                raise _BadRequest(
                    HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "request header too large"
                )
            line = line.rstrip(b"\r\n")
            if not line:
                if lines:
                    break
                continue  # RFC 9112 2.2: ignore empty lines before the request line
            lines.append(line)
        try:
            request_line = lines[0].decode("ascii")
        except UnicodeDecodeError:
            raise _BadRequest(HTTPStatus.BAD_REQUEST, "request line is not ASCII") from None
        parts = request_line.split(" ")
        if len(parts) != 3 or not _METHOD.fullmatch(parts[0]) or not parts[2].startswith("HTTP/1."):
            raise _BadRequest(HTTPStatus.BAD_REQUEST, "malformed HTTP/1.x request line")
        method, target, _ = parts
        try:
            path = urlsplit(target).path or "/"
        except ValueError:
            raise _BadRequest(HTTPStatus.BAD_REQUEST, "malformed request target") from None
        names = {line.partition(b":")[0].strip().lower() for line in lines[1:]}
        has_body = bool(names & {b"content-length", b"transfer-encoding"})
        return method, path, has_body

    async def _answer(self, writer: asyncio.StreamWriter, method: str, path: str) -> None:
        if method not in ("GET", "HEAD"):
            await self._send(
                writer,
                HTTPStatus.METHOD_NOT_ALLOWED,
                f"method {method} not allowed; use GET\n",
                extra_headers={"Allow": "GET, HEAD"},
            )
            return
        head_only = method == "HEAD"
        content_type = "text/plain; charset=utf-8"
        if self._refresh is not None and path in _REFRESHED:
            await self._refreshed(path)
        try:
            if path == "/metrics":
                status, body, content_type = HTTPStatus.OK, self.metrics.render(), CONTENT_TYPE
            elif path == "/healthz":
                # Answering at all proves the event loop runs, which is what liveness asks.
                status, body = HTTPStatus.OK, b"ok\n"
            elif path == "/readyz":
                ready, reason = self.status.readiness()
                status = HTTPStatus.OK if ready else HTTPStatus.SERVICE_UNAVAILABLE
                body = f"{reason}\n".encode()
            elif path == "/status":
                document = json.dumps(self.status.to_json(), indent=2) + "\n"
                status, body, content_type = HTTPStatus.OK, document.encode(), "application/json"
            else:
                status, body = HTTPStatus.NOT_FOUND, f"not found; try {_PATHS}\n".encode()
        except Exception:
            log.exception("metrics server: cannot render %s", path)
            status, body = HTTPStatus.INTERNAL_SERVER_ERROR, b"internal error, see the plugin log\n"
        await self._send(writer, status, body, content_type=content_type, head_only=head_only)

    async def _refreshed(self, path: str) -> None:
        assert self._refresh is not None
        try:
            async with asyncio.timeout(_REFRESH_TIMEOUT_S):
                await self._refresh()
        except TimeoutError:
            log.warning(
                "metrics server: reading GPU usage for %s took over %.0f s",
                path,
                _REFRESH_TIMEOUT_S,
            )
        except Exception:
            log.exception("metrics server: reading GPU usage for %s failed", path)

    async def _send(
        self,
        writer: asyncio.StreamWriter,
        status: HTTPStatus,
        body: bytes | str,
        *,
        content_type: str = "text/plain; charset=utf-8",
        extra_headers: dict[str, str] | None = None,
        head_only: bool = False,
    ) -> None:
        payload = body.encode() if isinstance(body, str) else body
        headers = {
            "Content-Type": content_type,
            "Content-Length": str(len(payload)),
            "Cache-Control": "no-store",
            "Connection": "close",
            **(extra_headers or {}),
        }
        head = f"HTTP/1.1 {status.value} {status.phrase}\r\n" + "".join(
            f"{name}: {value}\r\n" for name, value in headers.items()
        )
        writer.write(head.encode("ascii") + b"\r\n" + (b"" if head_only else payload))
        async with asyncio.timeout(self._write_timeout):
            await writer.drain()
