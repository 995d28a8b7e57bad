"""Pods admitted by the simulated kubelet, and its PodResources service.

Kubelet's device manager records, per pod and container, which device IDs of which resource it
handed out; the PodResources API (`pod-resources/kubelet.sock`) is how a device plugin learns that
record. The response shapes copy kubelet's `containerDevicesFromResourceDeviceInstances`: one
`ContainerDevices` entry per device and NUMA node, not one per resource, so clients must merge.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import grpc

from sharing_plugin.kit.unix_grpc import Context
from sharing_plugin.kubelet.api.deviceplugin.v1beta1 import api_pb2 as dp
from sharing_plugin.kubelet.api.podresources.v1 import api_pb2 as pr
from sharing_plugin.kubelet.api.podresources.v1 import api_pb2_grpc as pr_grpc
from sharing_plugin.sim.kubelet.hold import Hold


@dataclass(frozen=True, slots=True)
class ContainerAllocation:
    """The devices of one resource given to one container, and the plugin's Allocate answer."""

    container: str
    resource: str
    device_ids: tuple[str, ...]
    response: dp.ContainerAllocateResponse


@dataclass(frozen=True, slots=True)
class PodAllocation:
    """Everything admit_pod handed out for one pod, in container then resource order."""

    name: str
    namespace: str
    allocations: tuple[ContainerAllocation, ...]
    # Every container of the pod, including those that asked for no device.
    container_names: tuple[str, ...] = ()

    def get(self, container: str, resource: str) -> ContainerAllocation:
        for allocation in self.allocations:
            if allocation.container == container and allocation.resource == resource:
                return allocation
        raise KeyError(f"pod {self.namespace}/{self.name} has no {resource} in {container!r}")

    def device_ids(self, container: str, resource: str) -> tuple[str, ...]:
        return self.get(container, resource).device_ids

    @property
    def containers(self) -> dict[str, dict[str, tuple[str, ...]]]:
        """container -> resource -> device IDs (kubelet's podDevices entry for this pod)."""
        result: dict[str, dict[str, tuple[str, ...]]] = {c: {} for c in self.container_names}
        for a in self.allocations:
            result.setdefault(a.container, {})[a.resource] = a.device_ids
        return result


def _topology(nodes: tuple[int, ...]) -> pr.TopologyInfo | None:
    return pr.TopologyInfo(nodes=[pr.NUMANode(ID=n) for n in nodes]) if nodes else None


def container_devices(
    resource: str, ids: Iterable[str], numa: Mapping[str, tuple[int, ...]]
) -> list[pr.ContainerDevices]:
    """One entry per device and NUMA node; a device without topology gets one entry without."""
    entries: list[pr.ContainerDevices] = []
    for device_id in ids:
        nodes = numa.get(device_id, ())
        if not nodes:
            entries.append(pr.ContainerDevices(resource_name=resource, device_ids=[device_id]))
        for node in nodes:
            entries.append(
                pr.ContainerDevices(
                    resource_name=resource, device_ids=[device_id], topology=_topology((node,))
                )
            )
    return entries


class PodResourcesServicer(pr_grpc.PodResourcesListerServicer):
    """Answers from the simulator's live state, read through the two callables at each call."""

    def __init__(
        self,
        *,
        pods: Callable[[], Iterable[PodAllocation]],
        numa: Callable[[str], Mapping[str, tuple[int, ...]]],
        devices: Callable[[], Mapping[str, Iterable[str]]],
        hold: Hold | None = None,
    ) -> None:
        self._pods = pods
        self._numa = numa
        self._devices = devices
        self._hold = hold

    def _pod(self, pod: PodAllocation) -> pr.PodResources:
        containers = [
            pr.ContainerResources(
                name=container,
                devices=[
                    entry
                    for resource, ids in resources.items()
                    for entry in container_devices(resource, ids, self._numa(resource))
                ],
            )
            for container, resources in pod.containers.items()
        ]
        return pr.PodResources(name=pod.name, namespace=pod.namespace, containers=containers)

    async def List(
        self, request: pr.ListPodResourcesRequest, context: Context
    ) -> pr.ListPodResourcesResponse:
        # The answer is taken now and may be held back before it is sent: it then tells the
        # state of this moment, as a slow kubelet's answer does.
        response = pr.ListPodResourcesResponse(pod_resources=[self._pod(p) for p in self._pods()])
        if self._hold is not None:
            await self._hold.passage()
        return response

    async def GetAllocatableResources(
        self, request: pr.AllocatableResourcesRequest, context: Context
    ) -> pr.AllocatableResourcesResponse:
        # Kubelet answers with every device it knows (its allDevices), healthy or not.
        devices = [
            entry
            for resource, ids in self._devices().items()
            for entry in container_devices(resource, ids, self._numa(resource))
        ]
        return pr.AllocatableResourcesResponse(devices=devices)

    async def Get(
        self, request: pr.GetPodResourcesRequest, context: Context
    ) -> pr.GetPodResourcesResponse:
        for pod in self._pods():
            if pod.name == request.pod_name and pod.namespace == request.pod_namespace:
                return pr.GetPodResourcesResponse(pod_resources=self._pod(pod))
        # Kubelet returns a plain Go error here, which gRPC sends as UNKNOWN.
        await context.abort(
            grpc.StatusCode.UNKNOWN,
            f"pod {request.pod_name} in namespace {request.pod_namespace} not found",
        )
        raise AssertionError("unreachable: abort raises")
