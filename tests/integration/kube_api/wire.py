"""HTTP/1.1 on the wire: request bodies in, JSON answers and chunked watch streams out."""

from __future__ import annotations

import asyncio
import http
import json
from collections.abc import Mapping
from typing import Any

from .status import bad_request

_TRUE = ("1", "t", "T", "true", "TRUE", "True")  # Go's strconv.ParseBool


def is_true(value: str | None) -> bool:
    """A boolean query parameter as the API server parses it."""
    return value in _TRUE


def json_body(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError as e:
        raise bad_request(f"the request body is not valid JSON: {e}") from None


async def read_body(reader: asyncio.StreamReader, headers: Mapping[str, str]) -> bytes:
    if headers.get("transfer-encoding", "").lower() == "chunked":
        data = bytearray()
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
            if size == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":
                    pass  # trailers
                return bytes(data)
            data += await reader.readexactly(size)
            await reader.readexactly(2)
    length = int(headers.get("content-length") or 0)
    return await reader.readexactly(length) if length else b""


async def respond(writer: asyncio.StreamWriter, code: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    writer.write(
        f"HTTP/1.1 {code} {http.HTTPStatus(code).phrase}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    await writer.drain()


async def page_not_found(writer: asyncio.StreamWriter) -> bool:
    data = b"404 page not found\n"
    writer.write(
        b"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain; charset=utf-8\r\n"
        + f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    await writer.drain()
    return True


async def start_stream(writer: asyncio.StreamWriter, *, close: bool = False) -> None:
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        b"Cache-Control: no-cache, private\r\nTransfer-Encoding: chunked\r\n"
        + (b"Connection: close\r\n" if close else b"")
        + b"\r\n"
    )
    await writer.drain()


async def chunk(writer: asyncio.StreamWriter, event: dict[str, Any]) -> None:
    data = json.dumps(event).encode() + b"\n"
    writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    await writer.drain()


async def end_stream(writer: asyncio.StreamWriter) -> None:
    writer.write(b"0\r\n\r\n")
    await writer.drain()
