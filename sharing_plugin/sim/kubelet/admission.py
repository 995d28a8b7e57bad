"""Pod admission in the simulated kubelet: which devices a container gets, and Allocate.

Copies kubelet's `devicesToAllocate` and `allocateContainerResources`: the free devices are the
healthy ones no pod holds; when the plugin offers GetPreferredAllocation, its answer is asked
for with every free device and an empty must-include list, only the IDs that are really free are
kept (an answer may be short, long or wrong), and the rest is filled from the free list. Then one
Allocate call per container and resource, whose first container response is the one used; and
PreStartContainer when the plugin asked for it. Pods are admitted one at a time, as kubelet does.
A test can hold admission between the pick and the Allocate call (`allocate_hold`), where a
reload may withdraw the devices just picked.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

import grpc

from sharing_plugin.errors import KubeletError
from sharing_plugin.kubelet.api.deviceplugin.v1beta1 import api_pb2 as dp
from sharing_plugin.sim.kubelet.endpoint import PluginEndpoint, ResourceDevices
from sharing_plugin.sim.kubelet.hold import Hold
from sharing_plugin.sim.kubelet.pods import ContainerAllocation, PodAllocation

_T = TypeVar("_T")

# Kubelet bounds PreStartContainer at 30 s (KubeletPreStartContainerRPCTimeoutInSecs); other
# calls have no deadline there, but a test must never hang on a silent plugin.
_RPC_TIMEOUT_S = 30.0
# How many Allocate round trips are remembered for benchmarks (the latest ones).
_LATENCIES_KEPT = 100_000


class AdmissionError(KubeletError):
    """Kubelet would refuse this pod (UnexpectedAdmissionError); the message says why."""


def _go_code(code: grpc.StatusCode) -> str:
    """INVALID_ARGUMENT -> InvalidArgument, as grpc-go prints codes in kubelet's messages."""
    return "".join(part.capitalize() for part in code.name.split("_"))


class Admission:
    """Kubelet's podDevices: what each admitted pod holds, and how it got it."""

    def __init__(
        self,
        resources: Mapping[str, ResourceDevices],
        *,
        on_change: Callable[[], None],
        allocate_hold: Hold | None = None,
    ) -> None:
        self._resources = resources
        self._on_change = on_change
        self._allocate_hold = allocate_hold
        # Seconds each Allocate round trip took, as kubelet would time it (benchmarks read it).
        self.allocate_seconds: collections.deque[float] = collections.deque(maxlen=_LATENCIES_KEPT)
        self.pods: dict[tuple[str, str], PodAllocation] = {}
        self._lock = asyncio.Lock()

    def in_use(self, resource: str) -> set[str]:
        return {
            device_id
            for pod in self.pods.values()
            for a in pod.allocations
            if a.resource == resource
            for device_id in a.device_ids
        }

    async def admit(
        self, name: str, namespace: str, containers: Mapping[str, Mapping[str, int]]
    ) -> PodAllocation:
        async with self._lock:
            if (namespace, name) in self.pods:
                raise AdmissionError(
                    f"pod {namespace}/{name} is already admitted: delete it before admitting "
                    "it again"
                )
            taken: dict[str, set[str]] = {}
            allocations: list[ContainerAllocation] = []
            for container, requests in containers.items():
                for resource, count in requests.items():
                    if count <= 0:
                        continue
                    where = f"pod {namespace}/{name}, container {container!r}: "
                    try:
                        allocation = await self._allocate(
                            container, resource, count, taken.setdefault(resource, set())
                        )
                    except AdmissionError as exc:
                        raise AdmissionError(where + str(exc)) from exc
                    taken[resource].update(allocation.device_ids)
                    allocations.append(allocation)
            pod = PodAllocation(
                name=name,
                namespace=namespace,
                allocations=tuple(allocations),
                container_names=tuple(containers),
            )
            self.pods[(namespace, name)] = pod
            self._on_change()
            return pod

    def delete(self, name: str, namespace: str) -> None:
        if self.pods.pop((namespace, name), None) is None:
            raise KeyError(f"no pod {namespace}/{name} was admitted")
        self._on_change()

    async def _allocate(
        self, container: str, resource: str, count: int, taken: set[str]
    ) -> ContainerAllocation:
        state = self._resources.get(resource)
        endpoint = state.endpoint if state is not None else None
        if state is None or endpoint is None:
            raise AdmissionError(f"cannot allocate unregistered device {resource}")
        busy = self.in_use(resource) | taken
        free = [i for i in state.healthy_ids if i not in busy]
        if len(free) < count:
            raise AdmissionError(
                f"requested number of devices unavailable for {resource}. "
                f"Requested: {count}, Available: {len(free)}"
            )
        chosen: list[str] = []
        if endpoint.options.get_preferred_allocation_available:
            preferred = await self._preferred(endpoint, free, count)
            free_set = set(free)
            for device_id in preferred:
                if len(chosen) < count and device_id in free_set and device_id not in chosen:
                    chosen.append(device_id)
        for device_id in free:
            if len(chosen) == count:
                break
            if device_id not in chosen:
                chosen.append(device_id)
        if self._allocate_hold is not None:
            await self._allocate_hold.passage()
            # Kubelet looks the endpoint up again for Allocate: the plugin may have registered
            # anew meanwhile, or its stream ended (devicemanager `errEndpointStopped`).
            endpoint = state.endpoint
            if endpoint is None:
                raise AdmissionError(f"endpoint {resource} has been stopped")
        started = time.perf_counter()
        request = dp.AllocateRequest(
            container_requests=[dp.ContainerAllocateRequest(devices_ids=chosen)]
        )
        response = await _call(
            "Allocate", lambda: endpoint.stub.Allocate(request, timeout=_RPC_TIMEOUT_S)
        )
        self.allocate_seconds.append(time.perf_counter() - started)
        if not response.container_responses:
            raise AdmissionError(f"no containers return in allocation response {response}")
        if endpoint.options.pre_start_required:
            await _call(
                "PreStartContainer",
                lambda: endpoint.stub.PreStartContainer(
                    dp.PreStartContainerRequest(devices_ids=chosen), timeout=_RPC_TIMEOUT_S
                ),
            )
        return ContainerAllocation(
            container=container,
            resource=resource,
            device_ids=tuple(chosen),
            response=response.container_responses[0],
        )

    @staticmethod
    async def _preferred(endpoint: PluginEndpoint, free: list[str], count: int) -> list[str]:
        request = dp.PreferredAllocationRequest(
            container_requests=[
                dp.ContainerPreferredAllocationRequest(
                    available_deviceIDs=free, must_include_deviceIDs=[], allocation_size=count
                )
            ]
        )
        response = await _call(
            "GetPreferredAllocation",
            lambda: endpoint.stub.GetPreferredAllocation(request, timeout=_RPC_TIMEOUT_S),
        )
        if not response.container_responses:
            return []
        return list(response.container_responses[0].deviceIDs)


async def _call(method: str, call: Callable[[], Awaitable[_T]]) -> _T:
    """Make and await a plugin RPC; a failure becomes kubelet's admission message.

    The connection may be closed under the call (a new registration of the resource replaced
    the endpoint, or its stream ended): kubelet's call then fails with Canceled, not the pod's
    admission task.
    """
    try:
        return await call()
    except grpc.aio.AioRpcError as exc:
        raise AdmissionError(
            f"{method} failed due to rpc error: code = {_go_code(exc.code())} "
            f"desc = {exc.details()}, which is unexpected"
        ) from exc
    except (asyncio.CancelledError, grpc.aio.UsageError):
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
        raise AdmissionError(
            f"{method} failed due to rpc error: code = Canceled desc = grpc: the client "
            "connection is closing, which is unexpected"
        ) from None
