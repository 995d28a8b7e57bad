"""The node's labels as a Node Feature Discovery `NodeFeature` object (`useNodeFeatureAPI`).

NFD's master labels each node with the `spec.labels` of every `NodeFeature` object
(`nfd.k8s-sigs.io/v1alpha1`, namespaced) whose label `nfd.node.kubernetes.io/node-name` names
it; that label is how it finds the node, so the object carries it. One object per node and
writer: its name is `gpu-sharing-features-for-<node>`, NFD's documented pattern, apart from
GPU Feature Discovery's `nvidia-features-for-<node>` so that the two never overwrite each other.
Its owner is the plugin's pod where the pod is known, so that the garbage collector removes it
(and NFD the labels) when the pod is deleted, and a new pod takes it over.

The object is written only when the labels differ from what it holds: read once, then known,
so a restart whose labels did not change writes nothing and a reload that changes no label
touches nothing. Writes run in their own task, latest labels wins, so a reload never waits for
the API server. A refused write (no NodeFeature API on the server, a missing permission) is
logged once with what to do, and tried again with a growing delay; the rest of the plugin
serves on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from lightkube import AsyncClient

log = logging.getLogger(__name__)

GROUP: Final = "nfd.k8s-sigs.io"
VERSION: Final = "v1alpha1"
KIND: Final = "NodeFeature"
PLURAL: Final = "nodefeatures"
NODE_NAME_LABEL: Final = "nfd.node.kubernetes.io/node-name"
NAME_PREFIX: Final = "gpu-sharing-features-for-"
_RETRY_S: Final = (5.0, 10.0, 30.0, 60.0, 300.0)


@dataclass(frozen=True, slots=True)
class PodOwner:
    """The plugin's pod, from the downward API: the object's owner."""

    name: str
    uid: str


def object_name(node: str) -> str:
    return f"{NAME_PREFIX}{node}"


def node_feature(
    node: str, labels: Mapping[str, str], *, namespace: str, owner: PodOwner | None
) -> dict[str, Any]:
    """The object, as the API server is sent it."""
    metadata: dict[str, Any] = {
        "name": object_name(node),
        "namespace": namespace,
        "labels": {NODE_NAME_LABEL: node},
        "ownerReferences": _owners(owner),
    }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": metadata,
        "spec": {"labels": dict(labels)},
    }


def _owners(owner: PodOwner | None) -> list[dict[str, str]]:
    if owner is None:
        return []
    return [{"apiVersion": "v1", "kind": "Pod", "name": owner.name, "uid": owner.uid}]


def _resource() -> Any:
    from lightkube.core.resource_registry import resource_registry
    from lightkube.generic_resource import create_namespaced_resource

    found = resource_registry.get(f"{GROUP}/{VERSION}", KIND)
    return found or create_namespaced_resource(GROUP, VERSION, KIND, PLURAL)


_ABSENT: Final = object()  # the object is known not to exist


class NodeFeatureWriter:
    """Keeps one NodeFeature object holding the latest labels, or absent (see the module doc)."""

    def __init__(
        self, client: AsyncClient, node: str, *, namespace: str, owner: PodOwner | None
    ) -> None:
        self._client = client
        self.node = node
        self.namespace = namespace
        self.name = object_name(node)
        self._owner = owner
        self._wanted: dict[str, str] | None = None  # None: no object
        self._held: object = None  # what the server holds: None unknown, _ABSENT, or a body
        self._changed = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._trouble: str | None = None
        self.writes = 0

    def publish(self, labels: Mapping[str, str]) -> None:
        """Make the object hold exactly `labels` (returns at once)."""
        self._want(dict(labels))

    def withdraw(self) -> None:
        """Make the object go (returns at once)."""
        self._want(None)

    async def settled(self) -> None:
        """Wait until what was asked so far has been written, or failed once."""
        await self._idle.wait()

    async def run(self) -> None:
        delays = iter(_RETRY_S)
        while True:
            await self._changed.wait()
            self._changed.clear()
            try:
                await self._reconcile()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the API's trouble is not the plugin's: log, try again
                self._held = None  # read it again next time
                self._report(describe(exc, self.namespace))
                self._idle.set()
                delay = next(delays, _RETRY_S[-1])
                try:
                    await asyncio.wait_for(self._changed.wait(), delay)
                except TimeoutError:
                    self._changed.set()
                continue
            delays = iter(_RETRY_S)
            if self._trouble is not None:
                log.info("NodeFeature %s/%s written again", self.namespace, self.name)
                self._trouble = None
            if not self._changed.is_set():
                self._idle.set()

    def _want(self, labels: dict[str, str] | None) -> None:
        self._wanted = labels
        self._idle.clear()
        self._changed.set()

    async def _reconcile(self) -> None:
        if self._held is None:
            self._held = await self._read()
        wanted = self._wanted
        if wanted is None:
            if self._held is not _ABSENT:
                await self._remove()
            return
        body = node_feature(self.node, wanted, namespace=self.namespace, owner=self._owner)
        if self._held is _ABSENT:
            await self._client.create(_resource().from_dict(body))
        elif not _holds(self._held, body):
            await self._patch(body)
        else:
            return
        self._held = body
        self.writes += 1

    async def _read(self) -> object:
        from lightkube import ApiError

        try:
            found = await self._client.get(_resource(), self.name, namespace=self.namespace)
        except ApiError as exc:
            if exc.status.code == 404 and exc.status.details is not None:
                return _ABSENT  # the API is served; the object is not there
            raise
        return found.to_dict() if hasattr(found, "to_dict") else dict(found)

    async def _patch(self, body: dict[str, Any]) -> None:
        from lightkube.types import PatchType

        held = self._held
        assert isinstance(held, dict)
        stale = set((held.get("spec") or {}).get("labels") or {}) - set(body["spec"]["labels"])
        patch = {
            "metadata": {
                "labels": body["metadata"]["labels"],
                "ownerReferences": body["metadata"]["ownerReferences"],
            },
            "spec": {"labels": {**dict.fromkeys(stale), **body["spec"]["labels"]}},
        }
        await self._client.patch(
            _resource(), self.name, patch, namespace=self.namespace, patch_type=PatchType.MERGE
        )

    async def _remove(self) -> None:
        from lightkube import ApiError

        try:
            await self._client.delete(_resource(), self.name, namespace=self.namespace)
        except ApiError as exc:
            if exc.status.code != 404 or exc.status.details is None:
                raise
        self._held = _ABSENT
        self.writes += 1

    def _report(self, trouble: str) -> None:
        if trouble != self._trouble:
            log.warning("NodeFeature %s/%s: %s", self.namespace, self.name, trouble)
            self._trouble = trouble


def _holds(held: object, body: dict[str, Any]) -> bool:
    """Whether the object on the server already says what `body` says."""
    if not isinstance(held, dict):
        return False
    metadata = held.get("metadata") or {}
    owners = [
        {k: o.get(k) for k in ("apiVersion", "kind", "name", "uid")}
        for o in metadata.get("ownerReferences") or []
    ]
    return bool(
        ((held.get("spec") or {}).get("labels") or {}) == body["spec"]["labels"]
        and (metadata.get("labels") or {}).get(NODE_NAME_LABEL)
        == body["metadata"]["labels"][NODE_NAME_LABEL]
        and owners == body["metadata"]["ownerReferences"]
    )


def _refused(exc: BaseException) -> tuple[int, str] | None:
    """(HTTP code, message) of a refused request. A path the server does not serve at all
    (no such API group) is answered with a plain-text 404, not a Status: lightkube raises the
    HTTP client's error for it."""
    import httpx2
    from lightkube import ApiError

    if isinstance(exc, ApiError):
        return exc.status.code or 0, exc.status.message or ""
    if isinstance(exc, httpx2.HTTPStatusError):
        return exc.response.status_code, "the server could not find the requested resource"
    return None


def describe(exc: BaseException, namespace: str) -> str:
    """A refused write as one line that says what to do."""
    refused = _refused(exc)
    if refused is not None:
        code, message = refused
        if code == 404:
            return (
                f"the API server does not serve {PLURAL}.{GROUP}/{VERSION} ({message}): install "
                "Node Feature Discovery's CRDs, or set flags.useNodeFeatureAPI: false; the "
                "labels are not published as a NodeFeature until then"
            )
        if code == 403:
            return (
                f"forbidden (403): {message}; grant get, create, patch and delete on {PLURAL} "
                f"in API group {GROUP}, namespace {namespace}, to the plugin's service account "
                "(deploy/components/node-feature)"
            )
        return f"HTTP {code}: {message}"
    return f"{type(exc).__name__}: {exc}"
