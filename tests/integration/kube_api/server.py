"""The fake API server itself: listening, HTTP/1.1 with keep-alive, bearer tokens, and routing
each request to the API group that serves it."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import yaml_fast

from .core import CoreResources
from .dra import DraResources
from .permissions import Permissions
from .status import StatusError, status
from .wire import page_not_found, read_body, respond


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # names in lower case
    body: Any = None  # the JSON body, parsed; None when there is none (or it is not JSON)


class FakeKubeApi(CoreResources, DraResources):
    """An in-process kube-apiserver (see the package docstring).

    `tokens` maps bearer tokens to what they may do; None turns authentication off;
    `watch_window` is how many changes a watch can resume across (None: all of them).
    """

    def __init__(
        self,
        *,
        tokens: Mapping[str, Permissions] | None = None,
        watch_window: int | None = None,
    ) -> None:
        super().__init__(watch_window=watch_window)
        self._tokens = dict(tokens) if tokens is not None else None
        self.requests: list[Request] = []
        self.request_seen = asyncio.Event()  # set at every request; clear it to wait again
        self.patch_delay_s = 0.0  # PATCH answers wait this long (a slow API server)
        self._server: asyncio.Server | None = None
        self._port: int | None = None
        self._closing = False
        self._conns: set[asyncio.StreamWriter] = set()
        self._idle: set[asyncio.StreamWriter] = set()  # waiting for the next request
        self._handlers: set[asyncio.Task[Any]] = set()
        self.connections = 0  # TCP connections accepted so far (keep-alive reuses one)

    # -- lifecycle

    @property
    def url(self) -> str:
        if self._port is None:
            raise RuntimeError("FakeKubeApi is not started (use `async with`)")
        return f"http://127.0.0.1:{self._port}"

    async def __aenter__(self) -> FakeKubeApi:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self._port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        # End watches as a shutting-down server does (terminating chunk), then drop the rest.
        self._closing = True
        self.close_watches(clean=True)
        for writer in list(self._idle):
            writer.transport.abort()
        if self._handlers:
            await asyncio.wait(list(self._handlers), timeout=1.0)
        await self.down()

    async def down(self) -> None:
        """Stop listening and drop every connection: clients get connection refused."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in list(self._conns):
            writer.transport.abort()
        if self._handlers:
            await asyncio.wait(list(self._handlers), timeout=1.0)
        for task in list(self._handlers):
            task.cancel()
        if self._handlers:
            await asyncio.wait(list(self._handlers))

    async def up(self) -> None:
        """Listen again on the same port."""
        if self._server is None:
            assert self._port is not None, "up() before the server was ever started"
            self._server = await asyncio.start_server(self._accept, "127.0.0.1", self._port)

    async def restart(self) -> None:
        """An API server restart on the same storage: every connection drops, the server is
        away for a moment, and it comes back with a new watch cache that starts at the current
        resourceVersion (a watch from any older version gets 410 Gone), objects unchanged."""
        await self.down()
        self.compact()
        await self.up()

    def kubeconfig(
        self, path: Path, *, token: str | None = None, namespace: str = "default"
    ) -> Path:
        """Write a kubeconfig for this server (lightkube.KubeConfig.from_file loads it)."""
        user: dict[str, str] = {"token": token} if token is not None else {}
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            # Plain HTTP: nothing to verify, and without this every client loads the system's
            # CA bundle first (~50 ms of CPU each, dozens of clients per test run).
            "clusters": [
                {"name": "fake", "cluster": {"server": self.url, "insecure-skip-tls-verify": True}}
            ],
            "users": [{"name": "fake", "user": user}],
            "contexts": [
                {
                    "name": "fake",
                    "context": {"cluster": "fake", "user": "fake", "namespace": namespace},
                }
            ],
            "current-context": "fake",
        }
        path = Path(path)
        path.write_text(yaml_fast.dump(config, sort_keys=False))
        return path

    # -- HTTP

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self._conns.add(writer)
        self.connections += 1
        try:
            await self._serve(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        except asyncio.CancelledError:
            # Ending quietly: asyncio's server callback (3.11) calls exception() on this task
            # and would log a cancelled one as an error.
            pass
        finally:
            self._handlers.discard(task)
            self._conns.discard(writer)
            self._idle.discard(writer)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while not self._closing:
            self._idle.add(writer)
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return  # the client closed its connection between requests
            finally:
                self._idle.discard(writer)
            lines = head.decode("latin-1").split("\r\n")
            method, target, _version = lines[0].split(" ", 2)
            headers: dict[str, str] = {}
            for line in lines[1:]:
                if ":" in line:
                    name, value = line.split(":", 1)
                    headers[name.strip().lower()] = value.strip()
            raw = await read_body(reader, headers)
            keep_alive = await self._handle(method, target, headers, raw, reader, writer)
            if not keep_alive or headers.get("connection", "").lower() == "close":
                return

    async def _handle(
        self,
        method: str,
        target: str,
        headers: dict[str, str],
        raw: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> bool:
        parts = urlsplit(target)
        path = unquote(parts.path)
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        body: Any = None
        if raw:
            with contextlib.suppress(ValueError):
                body = json.loads(raw)
        self.requests.append(Request(method, path, query, headers, body))
        self.request_seen.set()
        if method == "PATCH" and self.patch_delay_s:
            await asyncio.sleep(self.patch_delay_s)  # a slow API server, as under load
        try:
            perms = self._authenticate(headers)
            segments = path.strip("/").split("/")
            if segments[:1] == ["apis"]:
                return await self._route_dra(method, segments, query, raw, writer, perms)
            if segments[:2] != ["api", "v1"]:
                return await page_not_found(writer)
            return await self._route_core(
                method, segments[2:], query, headers, raw, reader, writer, perms
            )
        except StatusError as e:
            await respond(writer, e.status["code"], e.status)
            return True

    def _authenticate(self, headers: Mapping[str, str]) -> Permissions | None:
        if self._tokens is None:
            return None
        scheme, _, token = headers.get("authorization", "").partition(" ")
        perms = self._tokens.get(token) if scheme.lower() == "bearer" else None
        if perms is None:
            raise StatusError(status(401, "Unauthorized", "Unauthorized"))
        return perms
