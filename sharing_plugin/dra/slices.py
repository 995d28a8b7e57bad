"""The node's pool in the API: its ResourceSlices, created, replaced and deleted as it changes.

A publish writes every slice of the pool with a new pool generation (the scheduler only trusts
the slices of the newest generation, and ignores a pool whose slices are not all there yet), then
deletes the slices the pool no longer needs. Slice names are fixed per position
(`<node>-<driver>-<n>`), so a republish replaces objects instead of piling up new ones. At start
the publisher reads what an earlier run left (slices of this driver on this node): the first
generation it writes is past theirs, and slices past the new count are deleted.

The kubelet deletes the driver's slices of its node when the plugin deregisters (and a new
kubelet may do so when it starts), so `publish(force=True)` looks at what the API holds and
rewrites the pool when any of it is missing or changed, even if the pool itself did not change;
the daemon does that after every registration. Each slice is owned by the Node object
(an owner reference), so deleting the node deletes its slices.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sharing_plugin.dra.resources import api_error, generic, resource_class, status_of
from sharing_plugin.views.dra_api import (
    CounterSet,
    PublishedDevice,
    dropped_features,
    resource_slices,
)

if TYPE_CHECKING:
    from lightkube import AsyncClient

log = logging.getLogger(__name__)

_PLURAL = "resourceslices"


class SlicePublisher:
    """Publishes one driver's pool of one node; every method raises KubeApiError on failure."""

    def __init__(
        self, client: AsyncClient, *, driver: str, node_name: str, api_version: str
    ) -> None:
        self._client = client
        self.driver = driver
        self.node_name = node_name
        self.api_version = api_version
        self._kind = resource_class(api_version, "ResourceSlice")
        self.generation = 0
        self._names: set[str] = set()  # slices of ours that exist (as far as we know)
        self._last: tuple[PublishedDevice, ...] | None = None
        self._last_counters: tuple[CounterSet, ...] = ()
        self._owner: list[dict[str, Any]] | None = None
        self._started = False
        self.dropped: frozenset[str] = frozenset()
        """The features whose fields the server did not keep in the last publish."""

    async def start(self) -> None:
        """Read what an earlier run left; find the Node that owns the slices."""
        existing = await self._ours()
        self._names = {s["metadata"]["name"] for s in existing}
        self.generation = max(
            (int(s["spec"]["pool"].get("generation", 0)) for s in existing), default=0
        )
        self._owner = await self._node_owner()
        self._started = True
        if existing:
            log.info(
                "found %d ResourceSlice(s) of driver %s on node %s (pool generation %d)",
                len(existing),
                self.driver,
                self.node_name,
                self.generation,
            )

    @property
    def published(self) -> tuple[PublishedDevice, ...] | None:
        """The devices of the last successful publish (None before the first)."""
        return self._last

    async def publish(
        self,
        devices: Sequence[PublishedDevice],
        *,
        counter_sets: Sequence[CounterSet] = (),
        force: bool = False,
    ) -> bool:
        """Make the pool hold `devices` and the `counter_sets` they consume from; whether
        anything was written."""
        if not self._started:
            await self.start()
        wanted, counters = tuple(devices), tuple(counter_sets)
        unchanged = wanted == self._last and counters == self._last_counters
        if unchanged and (not force or await self._intact()):
            return False
        generation = self.generation + 1
        documents = resource_slices(
            wanted,
            counter_sets=counters,
            node_name=self.node_name,
            driver=self.driver,
            generation=generation,
            api_version=self.api_version,
        )
        # The generation is taken before the first write: a publish that fails half-way is
        # retried with a newer one, never leaving two different pools under one generation.
        self.generation = generation
        names = set()
        dropped: set[str] = set()
        for document in documents:
            if self._owner:
                document["metadata"]["ownerReferences"] = self._owner
            stored = await self._write(document)
            dropped |= dropped_features(document, stored)
            names.add(document["metadata"]["name"])
        self.dropped = frozenset(dropped)
        for name in sorted(self._names - names):
            await self._delete(name)
        self._names = names
        self._last = wanted
        self._last_counters = counters
        log.info(
            "published %d device(s) of driver %s in %d ResourceSlice(s), pool %s generation %d",
            len(wanted),
            self.driver,
            len(documents),
            self.node_name,
            generation,
        )
        return True

    async def _intact(self) -> bool:
        """Whether the API still holds exactly the slices of the last publish."""
        existing = await self._ours()
        return {s["metadata"]["name"] for s in existing} == self._names and all(
            s["spec"]["pool"].get("generation") == self.generation for s in existing
        )

    async def clear(self) -> None:
        """Delete every slice of this driver on this node."""
        for document in await self._ours():
            await self._delete(document["metadata"]["name"])
        self._names = set()
        self._last = None
        self._last_counters = ()

    async def _ours(self) -> list[dict[str, Any]]:
        fields: dict[str, Any] = {"spec.nodeName": self.node_name, "spec.driver": self.driver}
        try:
            found = [s.to_dict() async for s in self._client.list(self._kind, fields=fields)]
        except Exception as exc:
            raise await api_error(exc, "listing ResourceSlices", "list", _PLURAL) from exc
        # Filtered here too: a server that ignores field selectors must not hand us others'.
        return [
            s
            for s in found
            if s.get("spec", {}).get("nodeName") == self.node_name
            and s.get("spec", {}).get("driver") == self.driver
        ]

    async def _write(self, document: dict[str, Any]) -> dict[str, Any]:
        """Create or replace the slice; the object as the server stored it."""
        name = document["metadata"]["name"]
        obj = generic(self.api_version, document)
        try:
            if name in self._names:
                try:
                    return dict((await self._client.replace(obj)).to_dict())
                except Exception as exc:
                    if (await status_of(exc) or (0, ""))[0] != 404:
                        raise
                    self._names.discard(name)  # deleted behind our back (the kubelet): create
            try:
                return dict((await self._client.create(obj)).to_dict())
            except Exception as exc:
                if (await status_of(exc) or (0, ""))[0] != 409:
                    raise
                # Left by an earlier run we did not see.
                return dict((await self._client.replace(obj)).to_dict())
        except Exception as exc:
            raise await api_error(exc, f"writing ResourceSlice {name}", "update", _PLURAL) from exc
        finally:
            self._names.add(name)

    async def _delete(self, name: str) -> None:
        try:
            await self._client.delete(self._kind, name)
        except Exception as exc:
            if (await status_of(exc) or (0, ""))[0] == 404:
                return
            raise await api_error(exc, f"deleting ResourceSlice {name}", "delete", _PLURAL) from exc

    async def _node_owner(self) -> list[dict[str, Any]] | None:
        from lightkube.resources.core_v1 import Node

        try:
            node = await self._client.get(Node, self.node_name)
        except Exception as exc:
            log.warning(
                "reading node %s for the ResourceSlices' owner: %s; publishing them without one",
                self.node_name,
                await api_error(exc, "get node", "get", "nodes"),
            )
            return None
        uid = node.metadata.uid if node.metadata is not None else None
        if not uid:
            return None
        return [{"apiVersion": "v1", "kind": "Node", "name": self.node_name, "uid": uid}]
