"""Watch streams: `?watch=true` answered as kube-apiserver's watch cache answers it.

A watch from a resourceVersion replays the history after it; without one (or from "0") it
starts with synthetic ADDED events for the current state; one from a version the history no
longer holds gets 410 Gone as an ERROR event inside a 200 stream. `timeoutSeconds` ends the
stream cleanly; the test can end it early, drop its connection, or send BOOKMARKs.
"""

from __future__ import annotations

import asyncio
from typing import Any

from .selectors import Match
from .status import bad_request, status
from .store import DROP, END, Kind, ObjectStore, Watch
from .wire import chunk, end_stream, is_true, start_stream


class WatchStreams(ObjectStore):
    async def _watch(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        kind: Kind,
        namespace: str | None,
        match: Match,
        query: dict[str, str],
    ) -> bool:
        rv_param = query.get("resourceVersion", "")
        if rv_param not in ("", "0") and not rv_param.isdigit():
            raise bad_request(f"invalid resource version: {rv_param!r}")
        timeout_param = query.get("timeoutSeconds", "")
        try:
            timeout = int(timeout_param) if timeout_param else 0
        except ValueError:
            raise bad_request(f"invalid timeoutSeconds: {timeout_param!r}") from None

        expired: str | None = None
        if self._expire_next:
            self._expire_next = False
            expired = f"too old resource version: {rv_param or 0} ({self._compacted})"
        elif rv_param not in ("", "0") and int(rv_param) < self._compacted:
            expired = f"too old resource version: {rv_param} ({self._compacted})"
        if expired is not None:
            # The watch cache answers an expired resourceVersion inside the stream, with 200 OK.
            await start_stream(writer)
            await chunk(writer, {"type": "ERROR", "object": status(410, "Expired", expired)})
            await end_stream(writer)
            return True

        watch = Watch(kind, namespace, match, is_true(query.get("allowWatchBookmarks")))
        if rv_param in ("", "0"):
            # No resourceVersion (or "0"): synthetic ADDED events for the current state first.
            for _, obj in self._selected(kind, namespace, match):
                watch.push({"type": "ADDED", "object": obj})
        else:
            since = int(rv_param)
            for change in self._history:
                if change.rv > since and (event := watch.event_for(change)) is not None:
                    watch.push(event)
        self._watches.add(watch)
        self.watches_opened += 1
        self._watch_changed.set()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if timeout > 0 else None
        # A watch answer says `Connection: close` (the real server keeps the connection): the
        # read below notices a client that goes away, and must not eat a next request's bytes.
        eof = asyncio.ensure_future(reader.read(1))
        try:
            await start_stream(writer, close=True)
            while True:
                while watch.pending:
                    item: Any = watch.pending.popleft()
                    if item is DROP:
                        writer.transport.abort()
                        return False
                    if item is END:
                        await end_stream(writer)
                        return False
                    await chunk(writer, item)
                watch.waiter = loop.create_future()
                remaining = None if deadline is None else max(0.0, deadline - loop.time())
                done, _ = await asyncio.wait(
                    {watch.waiter, eof}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                )
                watch.waiter = None
                if eof in done:
                    return False  # the client closed the stream (or sent something unexpected)
                if not done:
                    await end_stream(writer)  # timeoutSeconds: a clean end, as the server does
                    return False
        finally:
            self._watches.discard(watch)
            self._watch_changed.set()
            if not eof.done():
                eof.cancel()
                await asyncio.wait({eof})
            if not eof.cancelled():
                eof.exception()  # retrieved, so a reset connection is not logged
