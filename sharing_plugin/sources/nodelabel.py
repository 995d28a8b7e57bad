"""The node's config label, followed through the Kubernetes API.

An admin relabels a node (`nvidia.com/device-plugin.config=<name>`) to switch it to another
named config. The Node is followed like any object the plugin reads from the API (GET, then
WATCH, through every expiry, timeout and outage); only the label's value is passed on, and only
when it changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sharing_plugin.config.names import DEFAULT_CONFIG_LABEL
from sharing_plugin.sources.kube import WATCH_TIMEOUT_S, ObjectFollower, ObjectRef

if TYPE_CHECKING:
    from lightkube import AsyncClient

__all__ = ["NodeLabelWatcher"]


class NodeLabelWatcher:
    """Follows one label of one Node; `value` is None while the label (or the node) is absent."""

    def __init__(
        self,
        node_name: str,
        *,
        client: AsyncClient,
        label: str = DEFAULT_CONFIG_LABEL,
        on_trouble: Callable[[str | None], None] = lambda _: None,
        watch_timeout_s: tuple[int, int] = WATCH_TIMEOUT_S,
    ) -> None:
        from lightkube.resources.core_v1 import Node

        self.node_name = node_name
        self.label = label
        self._value: str | None = None
        self._on_change: Callable[[str | None], None] = lambda _: None
        self.follower = ObjectFollower(
            client,
            ObjectRef(Node, node_name),
            on_object=self._seen,
            on_trouble=on_trouble,
            watch_timeout_s=watch_timeout_s,
        )

    @property
    def value(self) -> str | None:
        return self._value

    async def fetch(self) -> str | None:
        """GET the node once and return the label (start-up: select the right config first).

        Raises KubeApiError; `run()` is the one that never raises.
        """
        self._value = self._label_of(await self.follower.fetch())
        return self._value

    async def run(self, on_change: Callable[[str | None], None]) -> None:
        """Follow the label until cancelled; call `on_change(value)` whenever it changes."""
        self._on_change = on_change
        await self.follower.run()

    def _label_of(self, node: Any | None) -> str | None:
        labels = node.metadata.labels if node is not None and node.metadata else None
        return (labels or {}).get(self.label)

    def _seen(self, node: Any | None) -> None:
        value = self._label_of(node)
        if value != self._value:
            self._value = value
            self._on_change(value)
