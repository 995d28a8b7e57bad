"""The node's config label, followed through the Kubernetes API: GET the Node, then WATCH it.

An admin relabels a node (`nvidia.com/device-plugin.config=<name>`) to switch it to another
named config. The watch must outlive API server restarts, expired resourceVersions (410 Gone),
and the server ending watches after their timeout, so every end or failure is logged and
answered by a fresh GET after a backoff (0.2 s doubling to 10 s); nothing here raises for API
trouble. A fresh GET on every reconnect, rather than resuming from the last resourceVersion,
means a change made while disconnected is never missed.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import Any

from sharing_plugin.errors import KubeApiError
from sharing_plugin.sources.kubeapi import KubeClient

__all__ = ["DEFAULT_LABEL", "KubeClient", "NodeLabelWatcher"]

log = logging.getLogger(__name__)

DEFAULT_LABEL = "nvidia.com/device-plugin.config"
_BACKOFF_MIN_S = 0.2
_BACKOFF_MAX_S = 10.0
# A watch that lived this long was healthy: reconnect without growing the backoff.
_HEALTHY_S = 30.0
_TROUBLE = (KubeApiError, OSError, EOFError, ValueError, TimeoutError)


class _Gone(Exception):
    """The watch's resourceVersion is too old (HTTP 410): list again."""


class NodeLabelWatcher:
    """Follows one label of one Node; `value` is None while the label is absent."""

    def __init__(
        self,
        node_name: str,
        *,
        label: str = DEFAULT_LABEL,
        client: KubeClient | None = None,
        watch_timeout_s: tuple[int, int] = (300, 600),
    ) -> None:
        if client is None:
            client = KubeClient.from_environment()
        if client is None:
            raise KubeApiError(
                "no Kubernetes credentials (neither an in-cluster service account nor "
                "KUBECONFIG): the node label cannot be watched"
            )
        self.node_name = node_name
        self.label = label
        self._client = client
        self._value: str | None = None
        # Spread watch renewals like client-go does, so nodes do not reconnect in lockstep.
        self._watch_timeout_s = watch_timeout_s
        self.reconnects = 0

    @property
    def value(self) -> str | None:
        return self._value

    async def fetch(self) -> str | None:
        """GET the node once and return the label (start-up: select the right config first).

        Raises KubeApiError (or OSError) on failure; `run()` is the one that never raises.
        """
        node = await self._client.get_node(self.node_name)
        self._value = self._label_of(node)
        return self._value

    async def run(self, on_change: Callable[[str | None], None]) -> None:
        """Follow the label forever; call `on_change(value)` whenever `value` changes."""
        loop = asyncio.get_running_loop()
        delay = _BACKOFF_MIN_S
        while True:
            started = loop.time()
            try:
                await self._follow(on_change)
                log.debug("watch of node %s ended by the server; reconnecting", self.node_name)
            except _Gone:
                log.info("watch of node %s expired (410 Gone); listing again", self.node_name)
            except _TROUBLE as exc:
                log.warning(
                    "watching label %s of node %s failed: %s; retrying in %.1fs",
                    self.label,
                    self.node_name,
                    exc,
                    delay,
                )
            if loop.time() - started >= _HEALTHY_S:
                delay = _BACKOFF_MIN_S
            await asyncio.sleep(delay)
            delay = min(delay * 2, _BACKOFF_MAX_S)
            self.reconnects += 1

    async def _follow(self, on_change: Callable[[str | None], None]) -> None:
        node = await self._client.get_node(self.node_name)
        self._set(self._label_of(node), on_change)
        version = _resource_version(node)
        timeout_s = random.randint(*self._watch_timeout_s)
        async for event in self._client.watch_node(self.node_name, version, timeout_s=timeout_s):
            kind = event.get("type")
            obj = event.get("object")
            if not isinstance(obj, dict):
                raise KubeApiError(f"watch event without an object: {str(event)[:200]}")
            if kind == "ERROR":
                if obj.get("code") == 410:
                    raise _Gone
                raise KubeApiError(
                    f"watch error: HTTP {obj.get('code')}: {obj.get('message')}",
                    code=obj.get("code") if isinstance(obj.get("code"), int) else None,
                )
            if kind in ("ADDED", "MODIFIED"):
                self._set(self._label_of(obj), on_change)
            elif kind == "DELETED":
                self._set(None, on_change)
            # BOOKMARK events only move the resourceVersion; a reconnect lists again anyway.

    def _label_of(self, obj: dict[str, Any]) -> str | None:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        value = labels.get(self.label)
        return value if isinstance(value, str) else None

    def _set(self, value: str | None, on_change: Callable[[str | None], None]) -> None:
        if value != self._value:
            self._value = value
            on_change(value)


def _resource_version(obj: dict[str, Any]) -> str:
    version = (obj.get("metadata") or {}).get("resourceVersion")
    if not isinstance(version, str) or not version:
        raise KubeApiError("the Node has no metadata.resourceVersion")
    return version
