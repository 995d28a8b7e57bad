"""The pods bound to this node, by UID, followed through the Kubernetes API.

A GPU process's cgroup names its pod by UID and its container by the runtime's ID; this is
what turns them into a namespace, a pod name and a container name. The pods are followed as
client-go's reflector follows a collection: LIST with the field selector
``spec.nodeName=<node>`` across namespaces, then WATCH from the list's resourceVersion (a
server-side timeout spread with jitter, a client-side guard a little longer); every failure,
`410 Gone` included, starts again from a fresh LIST with backoff, so no deletion is missed. The
client, the backoff and the watch timeouts are the ones the other followers of the API use.

Only what attribution needs is kept per pod: namespace, name, UID (and, for a static pod, the
UID kubelet gave it, which its cgroup carries: the mirror pod's `kubernetes.io/config.mirror`
annotation), and container ID -> name from its container statuses. A `403` is logged once as
the permission to grant (list and watch on pods: `deploy/components/usage`).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sharing_plugin.sources.kube import BACKOFF_S, WATCH_TIMEOUT_S, api_status
from sharing_plugin.usage.cgroup import container_id
from sharing_plugin.usage.model import PodIdentity

if TYPE_CHECKING:
    from lightkube import AsyncClient

log = logging.getLogger(__name__)

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
_GUARD_S = 30  # a watch silent for its timeout plus this long is dead


class NodePods:
    """Pods on `node_name` by UID; `synced` is set once a first LIST has been read."""

    def __init__(
        self,
        client: AsyncClient,
        node_name: str,
        *,
        watch_timeout_s: tuple[int, int] = WATCH_TIMEOUT_S,
        backoff_s: tuple[float, float] = BACKOFF_S,
    ) -> None:
        self._client = client
        self.node_name = node_name
        self._watch_timeout_s = watch_timeout_s
        self._backoff_s = backoff_s
        self._pods: dict[str, PodIdentity] = {}  # pod UID -> identity
        self._uids: dict[tuple[str, str], tuple[str, ...]] = {}  # (namespace, name) -> its UIDs
        self.synced = asyncio.Event()
        self._logged: set[int] = set()

    @property
    def by_uid(self) -> Mapping[str, PodIdentity]:
        return self._pods

    async def run(self) -> None:
        """Follow the node's pods until cancelled; never raises for API trouble."""
        delay = self._backoff_s[0]
        while True:
            try:
                await self._list_and_watch()
                delay = self._backoff_s[0]
                continue  # the watch's time was up: LIST again
            except Exception as exc:
                status = await api_status(exc)
                self._trouble(status, exc)
            await asyncio.sleep(delay * random.uniform(0.8, 1.2))
            delay = min(delay * 2, self._backoff_s[1])

    async def _list_and_watch(self) -> None:
        from lightkube import ALL_NS
        from lightkube.resources.core_v1 import Pod

        listing = self._client.list(Pod, namespace=ALL_NS, fields={"spec.nodeName": self.node_name})
        pods: dict[str, PodIdentity] = {}
        uids: dict[tuple[str, str], tuple[str, ...]] = {}
        async for pod in listing:
            _put(pod, pods, uids)
        # Replaced at once, only once the listing is whole: a reader never sees the map empty
        # while a LIST runs, and a LIST that fails keeps what the last one found.
        self._pods.clear()
        self._pods.update(pods)
        self._uids = uids
        version = listing.resourceVersion
        if self._logged:
            log.info("pods on node %s are readable again", self.node_name)
            self._logged.clear()
        self.synced.set()
        timeout = random.randint(*self._watch_timeout_s)
        watch = self._client.watch(
            Pod,
            namespace=ALL_NS,
            fields={"spec.nodeName": self.node_name},
            resource_version=version,
            server_timeout=timeout,
        )  # lightkube raises every error of the stream (410 Gone included) to the loop above
        guard = asyncio.timeout(timeout + _GUARD_S)
        try:
            async with guard:
                async for kind, pod in watch:
                    if kind == "BOOKMARK":
                        continue
                    if kind == "DELETED":
                        self._gone(pod)
                    else:
                        self._seen(pod)
        except TimeoutError:
            if not guard.expired():
                raise

    def _seen(self, pod: Any) -> None:
        self._gone(pod)
        _put(pod, self._pods, self._uids)

    def _gone(self, pod: Any) -> None:
        meta = pod.metadata
        if meta is None:
            return
        for uid in self._uids.pop((meta.namespace or "", meta.name or ""), ()):
            self._pods.pop(uid, None)

    def _trouble(self, status: tuple[int, str] | None, exc: BaseException) -> None:
        where = f"listing pods on node {self.node_name}"
        if status is None:
            log.warning("%s: %s: %s; retrying", where, type(exc).__name__, exc)
            return
        code, message = status
        if code in (401, 403):
            if code not in self._logged:
                self._logged.add(code)
                log.error(
                    "%s: %s (%d): %s; GPU processes are named from PodResources only until "
                    "the plugin's service account may list and watch pods "
                    "(deploy/components/usage)",
                    where,
                    "forbidden" if code == 403 else "credentials refused",
                    code,
                    message,
                )
            return
        log.warning("%s: HTTP %d: %s; retrying", where, code, message)


def _put(
    pod: Any,
    pods: dict[str, PodIdentity],
    by_name: dict[tuple[str, str], tuple[str, ...]],
) -> None:
    """Enter `pod` in `pods` by its UIDs (its own, and a static pod's mirror) and in
    `by_name`."""
    meta = pod.metadata
    if meta is None or not meta.uid:
        return
    statuses = [
        *(getattr(pod.status, "containerStatuses", None) or ()),
        *(getattr(pod.status, "initContainerStatuses", None) or ()),
        *(getattr(pod.status, "ephemeralContainerStatuses", None) or ()),
    ]
    identity = PodIdentity(
        namespace=meta.namespace or "",
        name=meta.name or "",
        uid=meta.uid,
        containers={container_id(s.containerID): s.name for s in statuses if s.containerID},
    )
    uids = [meta.uid.lower()]
    mirror = (meta.annotations or {}).get(MIRROR_ANNOTATION)
    if mirror:
        uids.append(mirror.lower())
    for uid in uids:
        pods[uid] = identity
    by_name[(identity.namespace, identity.name)] = tuple(uids)
