"""Fakes of the Kubernetes side: a ConfigMap volume written as kubelet writes it, and a tiny API
server that speaks the Node GET/WATCH protocol.

Both are real implementations of the other side (real files and symlinks, real HTTP over TCP),
so the code under test runs exactly as it does against kubelet and kube-apiserver.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import os
import shutil
import ssl as ssl_module
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit


class ConfigMapVolume:
    """A ConfigMap mounted as kubelet's AtomicWriter lays it out.

    `..<timestamp>/` holds the keys, `..data` points at it, and each key is a symlink
    `<key> -> ..data/<key>`. An update writes a new timestamped directory, points a `..data_tmp`
    symlink at it and renames that over `..data` (the atomic step), then fixes the key symlinks
    and removes the old directory.
    """

    def __init__(self, root: Path, data: Mapping[str, str]) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self._serial = 0
        self._current: str | None = None
        self.swapped_at = 0.0  # time.perf_counter() of the last atomic `..data` rename
        self.update(data)

    def _stamp(self) -> str:
        self._serial += 1
        now = datetime.datetime.now(datetime.UTC).strftime("%Y_%m_%d_%H_%M_%S")
        return f"..{now}.{os.getpid()}{self._serial:05d}"

    def update(self, data: Mapping[str, str]) -> None:
        stamp = self._stamp()
        new_dir = self.root / stamp
        new_dir.mkdir()
        for key, text in data.items():
            (new_dir / key).write_text(text)
        tmp = self.root / "..data_tmp"
        os.symlink(stamp, tmp)
        self.swapped_at = time.perf_counter()
        os.rename(tmp, self.root / "..data")
        for key in data:
            link = self.root / key
            if not link.is_symlink():
                os.symlink(f"..data/{key}", link)
        for entry in self.root.iterdir():
            if not entry.name.startswith(".") and entry.name not in data:
                entry.unlink()
        if self._current is not None:
            shutil.rmtree(self.root / self._current)
        self._current = stamp


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]


@dataclass
class _Watch:
    queue: asyncio.Queue[dict[str, Any] | None] = field(default_factory=asyncio.Queue)


class FakeKubeApi:
    """One Node behind `GET /api/v1/nodes/<name>` and its WATCH.

    Tests change labels (`set_label`), end every open watch (`close_watches`), make the next
    watch answer with 410 Gone (`expire_next_watch`) or forget history (`compact`); `requests`
    records what the client asked. With `token` set, other bearer tokens get 401.
    """

    def __init__(
        self,
        node_name: str,
        labels: Mapping[str, str] | None = None,
        *,
        token: str | None = None,
        ssl: ssl_module.SSLContext | None = None,
    ) -> None:
        self._ssl = ssl
        self.node_name = node_name
        self.labels = dict(labels or {})
        self.token = token
        self.requests: list[Request] = []
        self._rv = 100
        self._history: list[tuple[int, dict[str, Any]]] = []
        self._oldest = self._rv
        self._watches: list[_Watch] = []
        self._expire_next = False
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self.watch_started = asyncio.Event()
        self.request_seen = asyncio.Event()  # set at every request; clear it to wait again

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.sockets[0].getsockname()[:2]
        scheme = "https" if self._ssl is not None else "http"
        return f"{scheme}://{host}:{port}"

    @property
    def open_watches(self) -> int:
        return len(self._watches)

    def node(self) -> dict[str, Any]:
        return {
            "kind": "Node",
            "apiVersion": "v1",
            "metadata": {
                "name": self.node_name,
                "resourceVersion": str(self._rv),
                "labels": dict(self.labels),
            },
        }

    def set_label(self, key: str, value: str | None) -> None:
        if value is None:
            self.labels.pop(key, None)
        else:
            self.labels[key] = value
        self._rv += 1
        event = {"type": "MODIFIED", "object": self.node()}
        self._history.append((self._rv, event))
        for watch in self._watches:
            watch.queue.put_nowait(event)

    def close_watches(self) -> None:
        for watch in self._watches:
            watch.queue.put_nowait(None)

    def expire_next_watch(self) -> None:
        self._expire_next = True

    def compact(self) -> None:
        """Forget history: a watch from an older resourceVersion now gets 410 Gone."""
        self._history.clear()
        self._oldest = self._rv

    async def __aenter__(self) -> FakeKubeApi:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0, ssl=self._ssl)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self.close_watches()
        self._server.close()
        if self._handlers:
            await asyncio.wait(list(self._handlers), timeout=1.0)
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            await self._serve(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, ssl_module.SSLError):
            pass
        except asyncio.CancelledError:
            # Ending quietly: asyncio's server callback (3.11) calls exception() on this task
            # and would log a cancelled one as an error.
            pass
        finally:
            self._handlers.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                key, value = line.split(":", 1)
                headers[key.strip().lower()] = value.strip()
        parts = urlsplit(target)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        self.requests.append(Request(method, parts.path, query, headers))
        self.request_seen.set()
        if self.token is not None and headers.get("authorization") != f"Bearer {self.token}":
            await _respond(writer, 401, _status(401, "Unauthorized", "bad token"))
        elif method != "GET":
            await _respond(writer, 405, _status(405, "MethodNotAllowed", method))
        elif parts.path == f"/api/v1/nodes/{self.node_name}":
            await _respond(writer, 200, self.node())
        elif parts.path == "/api/v1/nodes" and query.get("watch") in ("true", "1"):
            if query.get("fieldSelector") != f"metadata.name={self.node_name}":
                await _respond(writer, 400, _status(400, "BadRequest", "fieldSelector"))
            else:
                await self._watch(writer, int(query.get("resourceVersion") or self._rv))
        else:
            await _respond(writer, 404, _status(404, "NotFound", parts.path))

    async def _watch(self, writer: asyncio.StreamWriter, since: int) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        if self._expire_next or since < self._oldest:
            # kube-apiserver answers an expired resourceVersion inside the stream, with 200 OK.
            self._expire_next = False
            await _chunk(writer, {"type": "ERROR", "object": _status(410, "Expired", "too old")})
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            return
        watch = _Watch()
        for rv, event in self._history:
            if rv > since:
                watch.queue.put_nowait(event)
        self._watches.append(watch)
        self.watch_started.set()
        try:
            while (pushed := await watch.queue.get()) is not None:
                await _chunk(writer, pushed)
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        finally:
            self._watches.remove(watch)


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }


async def _respond(writer: asyncio.StreamWriter, code: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    writer.write(
        f"HTTP/1.1 {code} X\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
        + data
    )
    await writer.drain()


async def _chunk(writer: asyncio.StreamWriter, event: dict[str, Any]) -> None:
    data = json.dumps(event).encode() + b"\n"
    writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    await writer.drain()
