"""The objects and their history, as etcd and the watch cache keep them for a client.

One global resourceVersion counter, bumped by every write that changes something (a write that
changes nothing leaves the object and its resourceVersion alone, as the real server does);
every object has uid, resourceVersion and creationTimestamp. Each change is kept in the history
that watches resume from, and handed to every open watch that sees it. The history is a window,
as the watch cache's is: `watch_window` changes at most (all by default), none from before a
compaction or a restart; a watch from a version older than the window gets 410 Gone, as
kube-apiserver answers `too old resource version: X (Y)`.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import datetime
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Kind:
    resource: str
    kind: str
    namespaced: bool
    fields: tuple[str, ...]  # field selectors the real server accepts (a subset)
    api_version: str = "v1"  # as stored


META_FIELDS = ("metadata.name", "metadata.namespace")


@dataclass
class Change:
    rv: int
    type: str  # ADDED, MODIFIED, DELETED
    kind: Kind
    namespace: str
    obj: dict[str, Any]  # the object after the change (for DELETED: the last state, new rv)
    old: dict[str, Any] | None


END = object()  # end the watch stream cleanly
DROP = object()  # drop the connection mid-stream


@dataclass(eq=False)
class Watch:
    """One open watch: what it selects, and what is still to be sent on its stream."""

    kind: Kind
    namespace: str | None  # None: every namespace (or a cluster-scoped kind)
    match: Callable[[dict[str, Any]], bool]
    bookmarks: bool
    pending: collections.deque[Any] = field(default_factory=collections.deque)
    waiter: asyncio.Future[None] | None = None

    def push(self, item: Any) -> None:
        self.pending.append(item)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def event_for(self, change: Change) -> dict[str, Any] | None:
        """What this watch sees of a change, as kube-apiserver's watch filter does: an object
        that starts matching the selectors is ADDED, one that stops matching is DELETED."""
        if change.kind is not self.kind:
            return None
        if self.namespace is not None and change.namespace != self.namespace:
            return None
        was = change.old is not None and self.match(change.old)
        if change.type == "DELETED":
            return {"type": "DELETED", "object": change.obj} if was else None
        now = self.match(change.obj)
        if was and now:
            return {"type": "MODIFIED", "object": change.obj}
        if now:
            return {"type": "ADDED", "object": change.obj}
        if was:
            return {"type": "DELETED", "object": change.obj}
        return None


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def without_rv(obj: dict[str, Any]) -> dict[str, Any]:
    return {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k != "resourceVersion"}}


class ObjectStore:
    """Storage, history and the open watches of the fake API server, and the test's controls
    over its watches."""

    def __init__(self, *, watch_window: int | None = None) -> None:
        self._rv = 100
        self._compacted = self._rv  # a watch may resume from this resourceVersion or later
        # How many changes the history holds (None: all), as the watch cache holds a window of
        # recent events: a watch from a version that fell out of it gets 410 Gone.
        self._window = watch_window
        self._objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._history: list[Change] = []
        self._watches: set[Watch] = set()
        self.watches_opened = 0  # watches registered so far (a 410 answer registers none)
        self._watch_changed = asyncio.Event()
        self._expire_next = False

    # -- watch control, from the test's side

    @property
    def open_watches(self) -> int:
        return len(self._watches)

    async def wait_watches(self, count: int = 1, timeout: float = 5) -> None:  # noqa: ASYNC109
        """Wait until at least `count` watches are open (TimeoutError otherwise)."""
        async with asyncio.timeout(timeout):
            while len(self._watches) < count:
                self._watch_changed.clear()
                await self._watch_changed.wait()

    async def wait_opened(self, total: int, timeout: float = 5) -> None:  # noqa: ASYNC109
        """Wait until `total` watches were opened since the start (TimeoutError otherwise)."""
        async with asyncio.timeout(timeout):
            while self.watches_opened < total:
                self._watch_changed.clear()
                await self._watch_changed.wait()

    def close_watches(self, *, clean: bool = True) -> None:
        """clean: end every open watch stream as a server-side timeout does (terminating chunk);
        clean=False: drop each watch's TCP connection mid-stream."""
        for watch in self._watches:
            watch.push(END if clean else DROP)

    def expire_next_watch(self) -> None:
        """The next watch request gets a 410 Gone ERROR event inside a 200 stream, which ends."""
        self._expire_next = True

    def compact(self) -> None:
        """Forget history: a watch from an older resourceVersion now gets 410 Gone (what etcd's
        compaction does, and what a restarted API server's new watch cache knows: nothing
        before the version it started at)."""
        self._history.clear()
        self._compacted = self._rv

    def send_bookmarks(self) -> None:
        """A BOOKMARK at the current resourceVersion to every watch that allowed bookmarks."""
        for watch in self._watches:
            if watch.bookmarks:
                watch.push(
                    {
                        "type": "BOOKMARK",
                        "object": {
                            "kind": watch.kind.kind,
                            "apiVersion": watch.kind.api_version,
                            "metadata": {"resourceVersion": str(self._rv)},
                        },
                    }
                )

    # -- storage

    def _new(self, kind: Kind, namespace: str, name: str) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name}
        if kind.namespaced:
            meta["namespace"] = namespace
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now()
        return {"kind": kind.kind, "apiVersion": kind.api_version, "metadata": meta}

    def _selected(
        self, kind: Kind, namespace: str | None, match: Callable[[dict[str, Any]], bool]
    ) -> list[tuple[str, dict[str, Any]]]:
        """(name, object) of every stored object of `kind` in `namespace` (None: all) that
        matches, in name order."""
        return [
            (key[2], obj)
            for key, obj in sorted(self._objects.items())
            if key[0] == kind.resource and namespace in (None, key[1]) and match(obj)
        ]

    def _commit(
        self, kind: Kind, namespace: str, name: str, obj: dict[str, Any] | None
    ) -> dict[str, Any] | None:
        """Store (or delete, obj None) one object; bump the resourceVersion and tell the watches
        when something changed. Returns what is stored now (for a delete: the final state)."""
        key = (kind.resource, namespace, name)
        old = self._objects.get(key)
        if obj is None:
            if old is None:
                return None
            del self._objects[key]
            self._rv += 1
            gone = copy.deepcopy(old)
            gone["metadata"]["resourceVersion"] = str(self._rv)
            self._publish(Change(self._rv, "DELETED", kind, namespace, gone, old))
            return gone
        if old is not None and without_rv(old) == without_rv(obj):
            return old
        obj = copy.deepcopy(obj)
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        self._objects[key] = obj
        self._publish(
            Change(self._rv, "MODIFIED" if old is not None else "ADDED", kind, namespace, obj, old)
        )
        return obj

    def _publish(self, change: Change) -> None:
        self._history.append(change)
        if self._window is not None and len(self._history) > self._window:
            dropped = self._history.pop(0)
            self._compacted = dropped.rv  # every change after it is still held
        for watch in self._watches:
            event = watch.event_for(change)
            if event is not None:
                watch.push(event)
