"""The node says what happened: Events on the Node, a config-state label and a config annotation.

What `kubectl describe node` and `kubectl get events` show an admin after an edit:
- Events (reasons `ConfigApplied`, `ConfigRejected`, `MigLayoutPending`, `MigLayoutApplied`,
  `GpuUnhealthy`, `GpuRecovered`, `GpuShareExceeded`; `run-dra`'s `ConfigWaitsForClaims` and
  `ConfigFullyApplied`, its only writes here) on the Node, in the `default` namespace
  as the kubelet files node events; `GpuShareExceeded` also on the pod, in its namespace. Like
  client-go's event recorder, a repeat of the same reason and message about the same object
  within ten minutes bumps the first event's `count` instead of creating another, and each
  reason has a token bucket (burst 25, one more every 5 minutes, shared by every object) so an
  Xid storm or an edit loop cannot flood the API server; what the bucket refuses is dropped
  and counted in the log.
- With `--node-labels on`, the GFD-compatible labels of the plan, merge-patched so that only
  the keys this plugin owns change (stale ones are removed).
- The label `nvidia.com/device-plugin.config.state` = `success` | `failed` | `pending` and the
  annotation `nvidia.com/device-plugin.config` = `NAME@HASH`, merge-patched when they change.

Writes go through a queue drained by `run()`, so a reload never waits for the API server; a
failed write is logged and the next state is written anyway (the label and annotation always
carry the latest values).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

from sharing_plugin.views.labels import owns

if TYPE_CHECKING:
    from lightkube import AsyncClient

log = logging.getLogger(__name__)

STATE_LABEL = "nvidia.com/device-plugin.config.state"
CONFIG_ANNOTATION = "nvidia.com/device-plugin.config"
COMPONENT = "gpu-sharing-plugin"
EVENT_NAMESPACE = "default"  # where the kubelet and the node controller file Node events
_AGGREGATE_S = 600.0
_BURST = 25
_REFILL_S = 300.0
_MAX_MESSAGE = 1024

State = Literal["success", "failed", "pending"]
EventType = Literal["Normal", "Warning"]


@dataclass(frozen=True, slots=True)
class PodRef:
    """The pod an event is about (the Node when none is given)."""

    namespace: str
    name: str
    uid: str | None = None


@dataclass(frozen=True, slots=True)
class NodeEvent:
    reason: str
    message: str
    type: EventType = "Normal"
    pod: PodRef | None = None


@dataclass(frozen=True, slots=True)
class _Labels:
    labels: dict[str, str]


@dataclass(slots=True)
class _Filed:
    name: str
    count: int
    first: str
    last_at: float
    namespace: str = EVENT_NAMESPACE


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float


class NodeStatusReporter:
    """Writes the node's view of the plugin (see the module doc)."""

    def __init__(
        self,
        client: AsyncClient,
        node_name: str,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self.node_name = node_name
        self._clock = clock
        self._queue: asyncio.Queue[NodeEvent | tuple[State, str | None] | _Labels] = asyncio.Queue()
        self._owned_on_node: set[str] | None = None  # our labels the Node carries
        self._filed: dict[tuple[PodRef | None, str, str], _Filed] = {}
        self._buckets: dict[str, _Bucket] = {}
        self._written: tuple[State | None, str | None] = (None, None)
        self.dropped = 0

    # --- what the daemon reports (never waits) -------------------------------------------------

    def event(
        self, reason: str, message: str, *, warning: bool = False, pod: PodRef | None = None
    ) -> None:
        """An event on the Node, or on `pod`."""
        self._queue.put_nowait(NodeEvent(reason, message[:_MAX_MESSAGE], _type(warning), pod))

    def state(self, state: State, config: str | None) -> None:
        """The config-state label and the `NAME@HASH` annotation (None leaves it as it is)."""
        self._queue.put_nowait((state, config))

    def labels(self, labels: Mapping[str, str]) -> None:
        """Make the Node carry exactly these of the labels this plugin owns."""
        self._queue.put_nowait(_Labels(dict(labels)))

    async def flush(self) -> None:
        """Wait until everything reported so far has been written (or failed)."""
        await self._queue.join()

    # --- writing ---------------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            item = await self._queue.get()
            try:
                if isinstance(item, NodeEvent):
                    await self._file(item)
                elif isinstance(item, _Labels):
                    await self._publish(item.labels)
                else:
                    await self._patch(*item)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the API's trouble is not the plugin's: log, go on
                log.warning("node %s status: %s", self.node_name, _describe(exc))
            finally:
                self._queue.task_done()

    async def clear(self) -> None:
        """Remove the label and annotation (SIGTERM with --clear-labels-on-exit)."""
        await self._merge_patch(
            {"labels": {STATE_LABEL: None}, "annotations": {CONFIG_ANNOTATION: None}}
        )

    async def _publish(self, labels: dict[str, str]) -> None:
        if self._owned_on_node is None:  # first time: what an earlier run left there
            from lightkube.resources.core_v1 import Node

            node = await self._client.get(Node, self.node_name)
            present = (node.metadata.labels if node.metadata else None) or {}
            self._owned_on_node = {key for key in present if owns(key)}
        stale = self._owned_on_node - labels.keys()
        patch: dict[str, str | None] = {**dict.fromkeys(stale), **labels}
        await self._merge_patch({"labels": patch})
        self._owned_on_node = set(labels)

    async def _patch(self, state: State, config: str | None) -> None:
        wanted = (state, config if config is not None else self._written[1])
        if wanted == self._written:
            return
        metadata: dict[str, Any] = {"labels": {STATE_LABEL: state}}
        if config is not None:
            metadata["annotations"] = {CONFIG_ANNOTATION: config}
        await self._merge_patch(metadata)
        self._written = wanted

    async def _merge_patch(self, metadata: dict[str, Any]) -> None:
        from lightkube.resources.core_v1 import Node
        from lightkube.types import PatchType

        await self._client.patch(
            Node, self.node_name, {"metadata": metadata}, patch_type=PatchType.MERGE
        )

    async def _file(self, event: NodeEvent) -> None:
        now = self._clock()
        key = (event.pod, event.reason, event.message)
        filed = self._filed.get(key)
        if filed is not None and now - filed.last_at < _AGGREGATE_S:
            await self._bump(filed, now)
            return
        if not self._take_token(event.reason, now):
            self.dropped += 1
            log.info("node event %s not filed (rate limit): %s", event.reason, event.message)
            return
        self._filed[key] = await self._create(event, now)

    def _take_token(self, reason: str, now: float) -> bool:
        bucket = self._buckets.setdefault(reason, _Bucket(float(_BURST), now))
        bucket.tokens = min(float(_BURST), bucket.tokens + (now - bucket.at) / _REFILL_S)
        bucket.at = now
        if bucket.tokens < 1:
            return False
        bucket.tokens -= 1
        return True

    async def _create(self, event: NodeEvent, now: float) -> _Filed:
        from lightkube.resources.core_v1 import Event

        stamp = _now()
        pod = event.pod
        if pod is None:
            namespace, name = EVENT_NAMESPACE, self.node_name
            involved: dict[str, str] = {"apiVersion": "v1", "kind": "Node", "name": name}
        else:
            namespace, name = pod.namespace, pod.name
            involved = {"apiVersion": "v1", "kind": "Pod", "name": name, "namespace": namespace}
            if pod.uid:
                involved["uid"] = pod.uid
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{name}.{time.time_ns():x}", "namespace": namespace},
            "involvedObject": involved,
            "reason": event.reason,
            "message": event.message,
            "type": event.type,
            "count": 1,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "source": {"component": COMPONENT, "host": self.node_name},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.node_name,
        }
        created = await self._client.create(cast(Event, Event.from_dict(body)))
        filed = created.metadata.name if created.metadata and created.metadata.name else ""
        return _Filed(name=filed, count=1, first=stamp, last_at=now, namespace=namespace)

    async def _bump(self, filed: _Filed, now: float) -> None:
        from lightkube.resources.core_v1 import Event
        from lightkube.types import PatchType

        filed.count += 1
        filed.last_at = now
        await self._client.patch(
            Event,
            filed.name,
            {"count": filed.count, "lastTimestamp": _now()},
            namespace=filed.namespace,
            patch_type=PatchType.MERGE,
        )


def _type(warning: bool) -> EventType:
    return "Warning" if warning else "Normal"


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _describe(exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    code = getattr(status, "code", None)
    if code == 403:
        return (
            f"forbidden (403): {getattr(status, 'message', '')}; grant patch on nodes and "
            "create/patch on events to the plugin's service account"
        )
    if code is not None:
        return f"HTTP {code}: {getattr(status, 'message', '')}"
    return f"{type(exc).__name__}: {exc}"
