"""The DevicePlugin gRPC service of one resource, answering from an atomically swapped snapshot.

Every call reads the server's current `Snapshot` exactly once, at its start, so a reload that
swaps the snapshot mid-call can never mix two plans in one answer. Requests are untrusted: a
refusal from the plan becomes INVALID_ARGUMENT with the plan's message, and anything else is
logged and answered INTERNAL; no request can take the server down. Refusals are answered with
`set_code`/`set_details`, not `context.abort()`: abort raises through the handler, and the
exception's traceback keeps the frame, and with it the whole request, in a reference cycle that
only a full garbage collection frees (ten 10 MiB requests held ~300 MiB).

Kubelet picks devices from the list it last received and asks for them a moment later, so an
Allocate may name a device that a reload withdrew in between. A device the snapshot withdrew
while it was Healthy is honoured for a short while (`Snapshot.withdrawn`): kubelet has already
promised it to the pod, and refusing fails the pod's admission. Every grant is noted in the
`GrantLedger`, a late one included, so that the supervisor keeps the device advertised
(draining) until the pod releases it.

ListAndWatch streams end only when kubelet cancels them or the server stops: kubelet treats a
stream that finishes as a dead plugin, marks every device Unhealthy and never reconnects
(devicemanager/plugin/v1beta1/client.go). Each stream keeps only the latest pending message, so a
burst of updates reaches a slow kubelet as one full list, not a backlog of stale ones.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import grpc

from sharing_plugin.config.model import Flags
from sharing_plugin.errors import AllocationError
from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.kubelet import translate
from sharing_plugin.kubelet.api.deviceplugin.v1beta1 import api_pb2 as dp
from sharing_plugin.kubelet.api.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from sharing_plugin.kubelet.grants import GrantLedger
from sharing_plugin.kubelet.recording import KubeletRecorder
from sharing_plugin.plan import (
    CONTROL_DEVICE_NODES,
    ResourcePlan,
    VirtualDevice,
    allocate,
    preferred,
)

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]

# What the plugin offers kubelet; kubelet reads these from GetDevicePluginOptions, not from the
# RegisterRequest, so both places must say the same.
OPTIONS = dp.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)


@dataclass(frozen=True)
class AllocateContext:
    """What Allocate and GetPreferredAllocation need besides the resource's devices."""

    flags: Flags
    inventory: Inventory | None = None
    control_nodes: tuple[str, ...] = CONTROL_DEVICE_NODES


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One consistent view of a resource: its plan, the flags, and the ListAndWatch message.

    `withdrawn`: devices an earlier snapshot advertised Healthy that this one does not, each
    with the loop time until which Allocate still honours it.
    """

    resource: ResourcePlan
    context: AllocateContext
    key: translate.DeviceKey
    message: dp.ListAndWatchResponse = field(compare=False)
    withdrawn: Mapping[str, tuple[VirtualDevice, float]] = field(
        default_factory=dict, compare=False
    )

    def serving(self, ids: Sequence[str], now: float) -> tuple[ResourcePlan, bool]:
        """The resource to answer a request for `ids` from, and whether it had to honour
        withdrawn devices. An ID neither advertised nor honoured is left for `allocate` to
        refuse."""
        if not self.withdrawn or all(i in self.resource for i in ids):
            return self.resource, False
        late: dict[str, VirtualDevice] = {}
        for device_id in ids:
            if device_id in self.resource or device_id in late:
                continue
            entry = self.withdrawn.get(device_id)
            if entry is None or entry[1] < now:
                return self.resource, False
            late[device_id] = entry[0]
        return replace(self.resource, devices=self.resource.devices + tuple(late.values())), True


def snapshot(
    resource: ResourcePlan,
    context: AllocateContext,
    *,
    previous: Snapshot | None = None,
    now: float = 0.0,
    honour_s: float = 0.0,
) -> Snapshot:
    """A snapshot of `resource`; after `previous`, honouring for `honour_s` (from `now`) the
    Healthy devices that `previous` advertised and `resource` drops."""
    key = translate.device_key(resource)
    withdrawn: dict[str, tuple[VirtualDevice, float]] = {}
    if previous is not None:
        withdrawn = {
            i: entry
            for i, entry in previous.withdrawn.items()
            if entry[1] >= now and i not in resource
        }
        if key != previous.key:
            until = now + honour_s
            for device in previous.resource.devices:
                if device.healthy and device.id not in resource:
                    withdrawn[device.id] = (device, until)
    return Snapshot(
        resource=resource,
        context=context,
        key=key,
        message=translate.list_response(resource.devices),
        withdrawn=withdrawn,
    )


class _Stream:
    """One open ListAndWatch call: the latest message not yet sent, and whether it is the last."""

    __slots__ = ("final", "pending", "wake")

    def __init__(self) -> None:
        self.pending: dp.ListAndWatchResponse | None = None
        self.final = False
        self.wake = asyncio.Event()

    def push(self, message: dp.ListAndWatchResponse | None, *, final: bool = False) -> None:
        if message is not None:
            self.pending = message
        self.final = self.final or final
        self.wake.set()


class DevicePluginServicer(dp_grpc.DevicePluginServicer):
    """The service behind one listening socket; `current` returns the snapshot to answer from."""

    def __init__(
        self,
        name: str,
        current: Callable[[], Snapshot],
        metrics: KubeletRecorder | None = None,
        grants: GrantLedger | None = None,
    ) -> None:
        self._name = name
        self._current = current
        self._metrics = metrics
        self._grants = grants
        self._streams: set[_Stream] = set()
        self._handlers: set[asyncio.Task[Any]] = set()

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    async def wait_streams_ended(self, timeout: float) -> None:  # noqa: ASYNC109
        """Wait (bounded) until every ListAndWatch handler has finished.

        grpc.aio's `Server.stop()` returns once the core has shut down, while the handler tasks
        it cancelled may not have run yet; waiting here leaves no task behind a stopped server.
        """
        if self._handlers:
            await asyncio.wait(set(self._handlers), timeout=timeout)
            # grpc's outer task for each call resumes right after its handler task ends.
            await asyncio.sleep(0)

    def broadcast(self, message: dp.ListAndWatchResponse | None, *, final: bool = False) -> None:
        """Queue `message` on every open stream (replacing one not yet sent); `final` ends them
        after it."""
        for stream in self._streams:
            stream.push(message, final=final)

    # -- the DevicePlugin service ------------------------------------------------------------

    async def GetDevicePluginOptions(
        self, request: dp.Empty, context: Context
    ) -> dp.DevicePluginOptions:
        return OPTIONS

    async def ListAndWatch(
        self, request: dp.Empty, context: Context
    ) -> AsyncIterator[dp.ListAndWatchResponse]:
        stream = _Stream()
        # Registering the stream and reading the first list happen with no await in between, so
        # an update can neither slip between them nor be sent twice.
        self._streams.add(stream)
        handler = asyncio.current_task()
        if handler is not None and handler not in self._handlers:
            # The task outlives this generator (grpc still sends the status after it), so it
            # leaves the set when it is done, not in `finally`.
            self._handlers.add(handler)
            handler.add_done_callback(self._handlers.discard)
        first = self._current().message
        try:
            yield first
            while True:
                if stream.pending is None and not stream.final:
                    await stream.wake.wait()
                stream.wake.clear()
                message, stream.pending = stream.pending, None
                if message is not None:
                    # Checked again before waiting: a push may land while this one is sent.
                    yield message
                elif stream.final:
                    return
        finally:
            self._streams.discard(stream)

    async def Allocate(self, request: dp.AllocateRequest, context: Context) -> dp.AllocateResponse:
        # No await in here: the snapshot read and the grant noted happen in one step of the
        # loop, so a reload sees either both or neither.
        snap = self._current()
        started = time.perf_counter()
        flags, nodes = snap.context.flags, snap.context.control_nodes
        now = asyncio.get_running_loop().time()
        responses: list[dp.ContainerAllocateResponse] = []
        granted: list[VirtualDevice] = []
        late = False
        try:
            # The IDs are not copied into a list: a refused request is refused at its first
            # unknown ID, without turning every other ID of a hostile request into a string.
            for req in request.container_requests:
                ids = req.devices_ids
                resource, honoured = snap.serving(ids, now)
                answer = allocate(resource, ids, flags, control_nodes=nodes)
                responses.append(translate.container_response(answer))
                granted.extend(d for d in map(resource.device, ids) if d is not None)
                late = late or honoured
        except AllocationError as exc:
            self._observe(started, ok=False)
            log.warning("refused Allocate for %s: %s", self._name, exc)
            return self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except Exception as exc:
            self._observe(started, ok=False)
            log.exception("Allocate for %s failed unexpectedly", self._name)
            return self._refuse(
                context,
                grpc.StatusCode.INTERNAL,
                f"device plugin for {self._name} failed to answer Allocate: "
                f"{type(exc).__name__}: {exc} (a bug: please report it with the plugin's log)",
            )
        if late:
            log.info(
                "honoured Allocate for %s of device(s) withdrawn a moment ago: kept as draining",
                self._name,
            )
        if self._grants is not None:
            self._grants.record(self._name, granted, late=late)
        self._observe(started, ok=True)
        return dp.AllocateResponse(container_responses=responses)

    @staticmethod
    def _refuse(context: Context, code: grpc.StatusCode, details: str) -> dp.AllocateResponse:
        context.set_code(code)
        context.set_details(details)
        return dp.AllocateResponse()

    async def GetPreferredAllocation(
        self, request: dp.PreferredAllocationRequest, context: Context
    ) -> dp.PreferredAllocationResponse:
        snap = self._current()
        policy = snap.context.flags.plugin.shared_devices_allocation_policy
        answers: list[dp.ContainerPreferredAllocationResponse] = []
        for req in request.container_requests:
            try:
                ids = preferred(
                    snap.resource,
                    list(req.available_deviceIDs),
                    list(req.must_include_deviceIDs),
                    req.allocation_size,
                    policy,
                    inventory=snap.context.inventory,
                )
            except Exception:
                # Kubelet fills a short answer from its own free list, so an empty answer only
                # costs the placement quality, never the pod.
                log.exception("GetPreferredAllocation for %s failed; answering none", self._name)
                ids = []
            answers.append(dp.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return dp.PreferredAllocationResponse(container_responses=answers)

    async def PreStartContainer(
        self, request: dp.PreStartContainerRequest, context: Context
    ) -> dp.PreStartContainerResponse:
        return dp.PreStartContainerResponse()

    def _observe(self, started: float, *, ok: bool) -> None:
        if self._metrics is not None:
            self._metrics.observe_allocate(self._name, time.perf_counter() - started, ok=ok)
