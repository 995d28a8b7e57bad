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
(devicemanager/plugin/v1beta1/client.go). Kubelet cancels a stream when it drops the
registration (it stops, or the superseded stream of another instance of the same resource ended:
see server.py); `on_lost` tells the owner when the last open stream ended so, so that it can
register again. Kubelet may also drop a registration before its stream reaches us: `opened`
counts the streams and `wait_opened` waits for the next, for the owner to notice one that never
came. Each stream keeps only the latest pending message, so a burst of updates reaches a slow
kubelet as one full list, not a backlog of stale ones.

Other clients may hold streams on the same socket, and none of them may slow kubelet's: the list
is serialised once per snapshot and every stream sends those bytes (a 7,168-device list is
~450 KB, and serialising it once per stream put 50 streams' worth of work before the last one),
and a stream whose reader stopped reading only ever waits on its own write. When the server
stops, it waits for the calls that can still finish, not for a stream stuck behind a write its
reader never takes (`wait_calls_ended`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from sharing_plugin.errors import AllocationError
from sharing_plugin.kit.unix_grpc import Context
from sharing_plugin.kubelet import translate
from sharing_plugin.kubelet.api.deviceplugin.v1beta1 import api_pb2 as dp
from sharing_plugin.kubelet.grants import GrantLedger
from sharing_plugin.kubelet.recording import KubeletRecorder
from sharing_plugin.kubelet.snapshot import Snapshot
from sharing_plugin.plan import (
    VirtualDevice,
    allocate,
    preferred,
)

log = logging.getLogger(__name__)


# What the plugin offers kubelet; kubelet reads these from GetDevicePluginOptions, not from the
# RegisterRequest, so both places must say the same.
OPTIONS = dp.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)
SERVICE = dp.DESCRIPTOR.services_by_name["DevicePlugin"].full_name


class _Stream:
    """One open ListAndWatch call: the latest list not yet sent, whether it is the last, and
    since when (loop time) its handler has been waiting for a send to complete."""

    __slots__ = ("final", "pending", "sending_since", "wake")

    def __init__(self) -> None:
        self.pending: bytes | None = None
        self.final = False
        self.sending_since: float | None = None
        self.wake = asyncio.Event()

    def push(self, payload: bytes | None, *, final: bool = False) -> None:
        if payload is not None:
            self.pending = payload
        self.final = self.final or final
        self.wake.set()


# A send begun before the server started stopping and not completed in this long belongs to a
# reader that does not read: kubelet takes a 7,168-device list in a few milliseconds.
STALLED_SEND_S = 0.25


class DevicePluginServicer:
    """The service behind one listening socket; `current` returns the snapshot to answer from.

    Registered with `add_to_server`, which sends ListAndWatch's serialised lists as they are.
    """

    def __init__(
        self,
        name: str,
        current: Callable[[], Snapshot],
        metrics: KubeletRecorder | None = None,
        grants: GrantLedger | None = None,
        on_lost: Callable[[], None] | None = None,
    ) -> None:
        """`on_lost` is called when a client ended the last open ListAndWatch stream while the
        server was not closing (kubelet dropped the registration)."""
        self._name = name
        self._on_lost = on_lost
        # Set while stepping aside (server.py): kubelet's connect to a registration fails.
        self.refuse_options = False
        self._current = current
        self._metrics = metrics
        self._grants = grants
        self._streams: dict[asyncio.Task[Any], _Stream] = {}
        # Every call's task: grpc's, which ends once the call's last message is sent.
        self._calls: set[asyncio.Task[Any]] = set()
        self._closing = False
        self._noted = False  # whether an Allocate note was logged
        self._closing_at = 0.0  # loop time of the final broadcast
        # ListAndWatch calls opened so far, and an event set (then replaced) at each.
        self.opened = 0
        self._opened = asyncio.Event()

    def broadcast(self, payload: bytes | None, *, final: bool = False) -> None:
        """Queue `payload` on every open stream (replacing one not yet sent); `final` ends them
        after it, and a stream opened later after its first list."""
        if final and not self._closing:
            self._closing = True
            self._closing_at = asyncio.get_running_loop().time()
        for stream in self._streams.values():
            stream.push(payload, final=final)

    async def wait_calls_ended(self, timeout: float) -> None:  # noqa: ASYNC109
        """Wait (at most `timeout`) until every call has finished, except streams stuck in a
        send begun before the final broadcast for STALLED_SEND_S: their reader does not read,
        and the server's stop cancels them. A send begun since (the final list) is waited for.

        grpc.aio's `Server.stop()` with a grace period waits for every call, and a stream whose
        reader froze with its window open never finishes (its socket buffer is full), so the
        grace ran out each time; after it, the cancellation could not complete either.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            now = loop.time()
            waiting = {t for t in self._calls if not t.done() and not self._stalled(t, now)}
            if not waiting or now >= deadline:
                return
            # Woken when a call ends or when a stream's send becomes stalled.
            stalls = [
                s.sending_since + STALLED_SEND_S
                for t, s in self._streams.items()
                if t in waiting and s.sending_since is not None and self._before_closing(s)
            ]
            until = min([deadline, *stalls])
            await asyncio.wait(
                waiting, timeout=max(0.0, until - now), return_when="FIRST_COMPLETED"
            )

    @property
    def streaming(self) -> bool:
        """Whether a ListAndWatch stream is open."""
        return bool(self._streams)

    async def wait_opened(self, after: int) -> None:
        """Return once more than `after` ListAndWatch calls were opened (see `opened`)."""
        while self.opened <= after:
            await self._opened.wait()

    def unfinished(self) -> set[asyncio.Task[Any]]:
        """The tasks of the calls still running."""
        return {t for t in self._calls if not t.done()}

    def _before_closing(self, stream: _Stream) -> bool:
        since = stream.sending_since
        return self._closing and since is not None and since < self._closing_at

    def _stalled(self, task: asyncio.Task[Any], now: float) -> bool:
        stream = self._streams.get(task)
        if stream is None or not self._before_closing(stream):
            return False
        assert stream.sending_since is not None
        return now - stream.sending_since >= STALLED_SEND_S

    def _track(self) -> asyncio.Task[Any] | None:
        call = asyncio.current_task()
        if call is not None and call not in self._calls:
            # The task outlives the handler (grpc still sends the answer or the status after
            # it), so it leaves the set when it is done.
            self._calls.add(call)
            call.add_done_callback(self._calls.discard)
        return call

    # -- the DevicePlugin service ------------------------------------------------------------

    async def GetDevicePluginOptions(
        self, request: dp.Empty, context: Context
    ) -> dp.DevicePluginOptions:
        self._track()
        if self.refuse_options:
            context.set_code(grpc.StatusCode.UNAVAILABLE)
            context.set_details(f"device plugin for {self._name} is leaving")
            return dp.DevicePluginOptions()
        return OPTIONS

    async def ListAndWatch(self, request: dp.Empty, context: Context) -> AsyncIterator[bytes]:
        call = self._track()
        stream = _Stream()
        loop = asyncio.get_running_loop()
        # Registering the stream and reading the first list happen with no await in between, so
        # an update can neither slip between them nor be sent twice.
        if call is not None:
            self._streams[call] = stream
        self.opened += 1
        self._opened.set()
        self._opened = asyncio.Event()
        payload: bytes | None = self._current().payload
        try:
            while payload is not None:
                stream.sending_since = loop.time()
                yield payload
                stream.sending_since = None
                if self._closing and not stream.final:
                    return  # opened after the final list: it had the current one
                # Checked again before waiting: a push may land while this one is sent.
                if stream.pending is None and not stream.final:
                    await stream.wake.wait()
                stream.wake.clear()
                payload, stream.pending = stream.pending, None
        finally:
            if call is not None:
                self._streams.pop(call, None)
            # Only a stop of ours ends a stream by itself: this one was ended by its client.
            if not (self._closing or stream.final or self._streams) and self._on_lost is not None:
                self._on_lost()

    async def Allocate(self, request: dp.AllocateRequest, context: Context) -> dp.AllocateResponse:
        self._track()
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
                if answer.note is not None and not self._noted:
                    self._noted = True  # once: every such container gets the same treatment
                    log.warning("%s: %s", self._name, answer.note)
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
        self._track()
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
        self._track()
        return dp.PreStartContainerResponse()

    def _observe(self, started: float, *, ok: bool) -> None:
        if self._metrics is not None:
            self._metrics.observe_allocate(self._name, time.perf_counter() - started, ok=ok)


def _as_is(payload: bytes) -> bytes:
    return payload


def add_to_server(servicer: DevicePluginServicer, server: grpc.aio.Server) -> None:
    """Serve `servicer` as `v1beta1.DevicePlugin` on `server`: the generated registration's
    table, except that ListAndWatch sends the bytes it yields as they are."""
    handlers = {
        "GetDevicePluginOptions": grpc.unary_unary_rpc_method_handler(
            servicer.GetDevicePluginOptions,
            request_deserializer=dp.Empty.FromString,
            response_serializer=dp.DevicePluginOptions.SerializeToString,
        ),
        "ListAndWatch": grpc.unary_stream_rpc_method_handler(
            servicer.ListAndWatch,
            request_deserializer=dp.Empty.FromString,
            response_serializer=_as_is,
        ),
        "GetPreferredAllocation": grpc.unary_unary_rpc_method_handler(
            servicer.GetPreferredAllocation,
            request_deserializer=dp.PreferredAllocationRequest.FromString,
            response_serializer=dp.PreferredAllocationResponse.SerializeToString,
        ),
        "Allocate": grpc.unary_unary_rpc_method_handler(
            servicer.Allocate,
            request_deserializer=dp.AllocateRequest.FromString,
            response_serializer=dp.AllocateResponse.SerializeToString,
        ),
        "PreStartContainer": grpc.unary_unary_rpc_method_handler(
            servicer.PreStartContainer,
            request_deserializer=dp.PreStartContainerRequest.FromString,
            response_serializer=dp.PreStartContainerResponse.SerializeToString,
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    # Registered methods skip the per-call lookup in the generic handlers (grpcio >= 1.63; the
    # type stubs predate it).
    server.add_registered_method_handlers(SERVICE, handlers)  # type: ignore[attr-defined]
