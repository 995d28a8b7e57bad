"""Which advertised devices pods hold, asked of kubelet's PodResources API (podresources/v1).

A reload that drops replicas must not lie about capacity while a pod still holds one: those IDs
stay advertised as Unhealthy until released (docs/contract.md), and only kubelet knows who
holds what.
The socket is optional (older kubelets, or the hostPath not mounted): its absence or a failing
call is tolerated, answered `None`, and logged once until it works again, so a reload never
fails because of it. Every such call is counted in the metrics, so how often the plugin went
without an answer shows after the one log line.

Kubelet answers one `ContainerDevices` entry per device and NUMA node, so entries are merged.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

import grpc

from sharing_plugin.gpus.holders import HeldReplica, Holder
from sharing_plugin.kubelet.api.constants import KUBELET_SOCKET, POD_RESOURCES_DIR
from sharing_plugin.kubelet.api.podresources.v1 import api_pb2 as pr
from sharing_plugin.kubelet.api.podresources.v1 import api_pb2_grpc as pr_grpc
from sharing_plugin.kubelet.recording import PodResourcesRecorder

log = logging.getLogger(__name__)

# Kubelet's PodResources server allows 16 MiB messages (podresources.DefaultMaxMsgSize); a node
# with many pods answers more than gRPC's default 4 MiB client limit.
MAX_RECEIVE_BYTES = 16 * 1024 * 1024
CALL_TIMEOUT_S = 2.0


class LastAnswer:
    """What pods hold per resource, as PodResources last answered.

    While the kubelet cannot tell (restarting, or its socket not mounted), pods are taken to hold
    what they held at its last answer (nothing before the first), so nothing a pod holds is
    dropped or stopped because the kubelet restarts.
    """

    def __init__(self, ask: Callable[[], Awaitable[Mapping[str, frozenset[str]] | None]]) -> None:
        """`ask` is PodResources' answer now (resource -> device IDs), None when it cannot tell."""
        self._ask = ask
        self.held: Mapping[str, frozenset[str]] = {}

    async def ask(self) -> Mapping[str, frozenset[str]] | None:
        """Ask now: the answer, or None when the kubelet cannot tell (`held` then stays)."""
        answer = await self._ask()
        if answer is not None:
            self.held = answer
        return answer


class PodResourcesClient:
    """A lazily connected client of `<kubelet-dir>/pod-resources/kubelet.sock`."""

    def __init__(self, kubelet_dir: Path, *, metrics: PodResourcesRecorder | None = None) -> None:
        self.socket = Path(kubelet_dir) / POD_RESOURCES_DIR / KUBELET_SOCKET
        self._metrics = metrics
        self._channel: grpc.aio.Channel | None = None
        self._unavailable = False

    async def held_devices(self) -> dict[str, frozenset[str]] | None:
        """Resource name -> device IDs any pod holds; None when kubelet cannot tell."""
        replicas = await self.held_replicas()
        if replicas is None:
            return None
        held: dict[str, set[str]] = {}
        for r in replicas:
            held.setdefault(r.resource, set()).add(r.device_id)
        return {name: frozenset(ids) for name, ids in held.items()}

    async def held_by(self) -> dict[str, Holder] | None:
        """Device ID -> the container holding it; None when kubelet cannot tell."""
        replicas = await self.held_replicas()
        if replicas is None:
            return None
        return {r.device_id: r.holder for r in replicas}

    async def held_replicas(self) -> list[HeldReplica] | None:
        """Every device a container holds, with its resource; None when kubelet cannot tell."""
        response = await self._list()
        if response is None:
            return None
        held = {
            HeldReplica(device_id, entry.resource_name, Holder(pod.namespace, pod.name, c.name))
            for pod in response.pod_resources
            for c in pod.containers
            for entry in c.devices
            for device_id in entry.device_ids
        }  # a set: kubelet answers a device once per NUMA node it spans
        return sorted(held, key=lambda r: (r.resource, r.device_id))

    async def close(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close(None)

    async def _list(self) -> pr.ListPodResourcesResponse | None:
        if not self.socket.exists():
            self._unavailable_once(f"{self.socket} does not exist")
            return None
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(
                f"unix://{self.socket}",
                options=[
                    ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
                    ("grpc.default_authority", "localhost"),
                ],
            )
        try:
            response: pr.ListPodResourcesResponse = await pr_grpc.PodResourcesListerStub(
                self._channel
            ).List(pr.ListPodResourcesRequest(), timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            # A fresh channel next time: after a kubelet restart the old one may sit in
            # reconnect back-off while the new socket already answers.
            await self.close()
            self._unavailable_once(f"List failed: {exc.code().name}: {exc.details()}")
            return None
        if self._unavailable:
            self._unavailable = False
            log.info("kubelet PodResources answers again on %s", self.socket)
        return response

    def _unavailable_once(self, why: str) -> None:
        if self._metrics is not None:
            self._metrics.count_pod_resources_error()
        if not self._unavailable:
            self._unavailable = True
            log.warning(
                "kubelet PodResources unavailable (%s): devices held by pods are taken as they "
                "were at its last answer (none if it never answered), so a reload may drop a "
                "device a pod holds; mount %s into the plugin",
                why,
                self.socket.parent,
            )
