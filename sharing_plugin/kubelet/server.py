"""One advertised resource in front of kubelet: a grpc.aio server on its own socket, registered.

Lifecycle, in the order kubelet forces (docs/contract.md):

    start()    listen on a fresh socket in <kubelet-dir>/device-plugins and check it answers;
    register() Register with kubelet, which dials back at once, so we must already serve;
    update()   swap the plan snapshot; kubelet hears of it only when what it sees changed;
    restart()  kubelet restarted (it wiped device-plugins/) or our socket vanished:
               listen on a new socket, register again, step aside (below) while kubelet
               still holds the old server's stream, then let the old server go;
    stop()     tell kubelet there are no devices, stop serving, delete our socket.

Two instances of one resource (a rolling update with maxSurge, or a relisten): kubelet (1.32
devicemanager/plugin/v1beta1/handler.go `runClient`) keeps only the latest registration of a
resource name, but a superseded stream stays open and its lists still apply; when that stream
ends, kubelet drops the registration it then holds, whosever it is: it cancels that stream and
marks the resource's devices Unhealthy. So stop() sends no empty list while another instance of
ours serves the same resource (a live socket of the same resource's name): the list would reach
kubelet's view of the resource, which the other instance serves. When that instance registered
after us, stop() first steps aside (handover.py), so that our stream ending leaves its
registration alone; restart() does the same for the registration it just made. Kubelet waits
10 s dialing an endpoint whose socket is gone, holding it as the resource's client all the
while, so a listener whose socket vanished steps aside through a short-lived socket of its own.
Should kubelet drop our registration anyway, we learn it from the servicer (kubelet ended the
stream of our registration while we serve) or from stream_watch.py (kubelet opened none after
Register): `on_lost`, and the owner registers again.

Socket names are unique per start (sockets.py). A plugin that was killed leaves its sockets
behind, and only a kubelet restart cleans the directory; `remove_stale_sockets` deletes, at
start, those of our names that nobody listens on, and `live_sockets` finds those somebody does
(what `run-dra` must not start beside).
Start, register, restart and stop are serialised by one lock; a supervisor that must stop
quickly cancels a pending register or restart before calling stop().
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from sharing_plugin.errors import KubeletError
from sharing_plugin.kit import unix_grpc
from sharing_plugin.kubelet import handover, registration
from sharing_plugin.kubelet.api.constants import (
    DEVICE_PLUGINS_DIR,
    KUBELET_MAX_RECEIVE_MESSAGE_BYTES,
)
from sharing_plugin.kubelet.api.deviceplugin.v1beta1 import api_pb2 as dp
from sharing_plugin.kubelet.api.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from sharing_plugin.kubelet.grants import GrantLedger
from sharing_plugin.kubelet.listener import SHUTDOWN_BOUND_S, Listener
from sharing_plugin.kubelet.recording import KubeletRecorder
from sharing_plugin.kubelet.servicer import OPTIONS, DevicePluginServicer, add_to_server
from sharing_plugin.kubelet.snapshot import AllocateContext, Snapshot, snapshot
from sharing_plugin.kubelet.sockets import (
    live_sockets,
    remove_stale_sockets,
    same_resource_sockets,
    socket_name,
)
from sharing_plugin.kubelet.stream_watch import StreamWatch
from sharing_plugin.plan import ResourcePlan

__all__ = [
    "SHUTDOWN_BOUND_S",
    "AllocateContext",
    "ResourceServer",
    "live_sockets",
    "remove_stale_sockets",
    "same_resource_sockets",
    "socket_name",
]

log = logging.getLogger(__name__)

# The largest request kubelet sends is GetPreferredAllocation, listing every free device ID of
# one resource (7,168 IDs of ~45 bytes is about 350 KiB). The plan refuses a resource of more
# than 60,000 devices (what one ListAndWatch message within kubelet's 4 MiB receive limit
# carries) and an ID is at most ~47 bytes (`MIG-<uuid>::<n>`), so no real request reaches 3 MiB.
# Kubelet's own limit leaves room above that; anything larger is refused by gRPC before it is
# parsed.
MAX_MESSAGE_BYTES = KUBELET_MAX_RECEIVE_MESSAGE_BYTES
SERVER_OPTIONS = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
)
# Kubelet picks devices from the list it holds and calls Allocate two RPCs later
# (GetPreferredAllocation first); a device withdrawn while it was Healthy is honoured this long.
WITHDRAWN_HONOURED_S = 5.0
_EMPTY_LIST = dp.ListAndWatchResponse().SerializeToString()


class ResourceServer:
    """Serves one resource's plan to kubelet; see the module docstring for the lifecycle."""

    def __init__(
        self,
        *,
        kubelet_dir: Path,
        resource: ResourcePlan,
        context: AllocateContext,
        metrics: KubeletRecorder | None = None,
        grants: GrantLedger | None = None,
        lingering: set[asyncio.Task[None]] | None = None,
        on_lost: Callable[[ResourceServer], None] | None = None,
    ) -> None:
        """`lingering` collects the grpc shutdowns of stopped listeners that a client which
        does not read holds up (one set for every server of a process: see `Listener.close`).
        `on_lost` is called (no longer registered) when kubelet ended the stream of our
        registration while we serve, or opened none after it; the owner registers again."""
        self._kubelet_dir = Path(kubelet_dir)
        self._plugin_dir = self._kubelet_dir / DEVICE_PLUGINS_DIR
        self._name = resource.name
        self._metrics = metrics
        self._grants = grants
        self._snapshot: Snapshot = snapshot(resource, context)
        self._listener: Listener | None = None
        self._lingering = lingering if lingering is not None else set()
        self._registered = False
        self._registered_at_ns = 0  # wall clock of our last registration
        self._registered_through: registration.KubeletSocketId | None = None
        self._on_lost = on_lost
        self._watch = StreamWatch(self._name, self._no_stream)
        self._lock = asyncio.Lock()

    # -- state ---------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    @property
    def socket_path(self) -> Path | None:
        return self._listener.path if self._listener is not None else None

    @property
    def registered(self) -> bool:
        return self._registered

    def registered_with(self, kubelet_socket: registration.KubeletSocketId | None) -> bool:
        """Whether our registration stands with the kubelet listening on `kubelet_socket`
        (`registration.kubelet_socket_id` now): not when it was made through an earlier one."""
        return (
            self._registered
            and kubelet_socket is not None
            and self._registered_through == kubelet_socket
        )

    @property
    def resource(self) -> ResourcePlan:
        return self._snapshot.resource

    @property
    def context(self) -> AllocateContext:
        return self._snapshot.context

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen on a fresh socket and check it answers; a no-op when already listening."""
        async with self._lock:
            if self._listener is None:
                self._listener = await self._listen()

    async def register(self) -> None:
        """Register with kubelet (listening first if needed); KubeletError when refused."""
        async with self._lock:
            await self._register()

    async def restart(self) -> None:
        """Listen on a new socket and register again, then stop the old server.

        The old server goes last so that a kubelet that is still alive (only our socket was
        deleted) keeps a working stream until the new registration replaces it; when kubelet
        still holds the old stream, we step aside first, or its end would make kubelet drop
        the new registration. Raises KubeletError when registration fails; the new socket
        keeps listening for a retry.
        """
        async with self._lock:
            old, self._listener = self._listener, None
            self._watch.cancel()
            self._set_registered(False)
            try:
                self._listener = await self._listen()
                await self._register()
                if old is not None and old.servicer.streaming:
                    await self._step_aside(old)
            finally:
                if old is not None:
                    await old.close(None)

    async def stop(self) -> None:
        """Advertise no devices, stop serving and delete our socket; idempotent.

        An Allocate that arrives while stopping names devices kubelet saw a moment ago: they
        are honoured as withdrawn ones, and the grant tells the supervisor to keep them.
        """
        async with self._lock:
            listener, self._listener = self._listener, None
            self._watch.cancel()
            if listener is None:
                return
            self._snapshot = self._next(replace(self._snapshot.resource, devices=()), None)
            # Kubelet keeps the devices of an ended stream as Unhealthy for 5 minutes; an empty
            # list first makes the resource's capacity drop to 0 at once. Not while another
            # instance serves the resource: kubelet would apply it to what that one serves.
            others = same_resource_sockets(listener.path)
            if self._registered and handover.superseded(others, self._registered_at_ns):
                await self._step_aside(listener)
            await listener.close(None if others else _EMPTY_LIST)
            self._set_registered(False)
            if others:
                log.info(
                    "stopped serving %s (socket %s removed); another instance serves it on %s: "
                    "no empty list sent",
                    self._name,
                    listener.path,
                    ", ".join(p.name for p in others),
                )
            else:
                log.info("stopped serving %s (socket %s removed)", self._name, listener.path)

    def update(self, resource: ResourcePlan, context: AllocateContext | None = None) -> bool:
        """Swap in a new snapshot; push one ListAndWatch message iff kubelet's view changed.

        Returns whether kubelet's view (ID, health, NUMA of each device, in order) changed.
        """
        if resource.name != self._name:
            raise ValueError(f"server for {self._name} cannot serve {resource.name}")
        old = self._snapshot
        new = self._snapshot = self._next(resource, context)
        if new.key == old.key:
            return False
        if self._listener is not None:
            self._listener.servicer.broadcast(new.payload)
        return True

    # -- internals -----------------------------------------------------------------------------

    def _next(self, resource: ResourcePlan, context: AllocateContext | None) -> Snapshot:
        old = self._snapshot
        return snapshot(
            resource,
            context or old.context,
            previous=old,
            now=asyncio.get_running_loop().time(),
            honour_s=WITHDRAWN_HONOURED_S,
        )

    async def _listen(self) -> Listener:
        self._plugin_dir.mkdir(parents=True, exist_ok=True)
        limit = unix_grpc.MAX_SOCKET_PATH_BYTES
        budget = limit - unix_grpc.socket_path_bytes(self._plugin_dir) - 1
        if budget < len("sharing-00000000.sock"):
            raise KubeletError(
                f"cannot listen for {self._name}: {self._plugin_dir} is too long for a unix "
                f"socket path ({limit} bytes at most); use a shorter kubelet dir"
            )
        path = self._plugin_dir / socket_name(self._name, max_length=min(budget, 64))
        servicer = DevicePluginServicer(
            self._name,
            lambda: self._snapshot,
            self._metrics,
            self._grants,
            on_lost=lambda: self._lost(servicer),
        )
        server = await unix_grpc.serve(
            path,
            lambda server: add_to_server(servicer, server),
            options=SERVER_OPTIONS,
            who=self._name,
            advice="check that the directory exists and is writable by the plugin",
        )
        listener = Listener(server, servicer, path, self._lingering)
        try:
            await self._check_answers(path)
        except BaseException:
            await listener.close(None)
            raise
        log.debug("serving %s on %s", self._name, path)
        return listener

    async def _check_answers(self, path: Path) -> None:
        await unix_grpc.check_answers(
            path,
            lambda channel: dp_grpc.DevicePluginStub(channel).GetDevicePluginOptions(
                dp.Empty(), timeout=unix_grpc.READY_TIMEOUT_S, wait_for_ready=True
            ),
            who=f"device plugin for {self._name}",
        )

    async def _register(self) -> None:
        listener = self._listener
        # A kubelet that started after us wiped device-plugins/, our socket included.
        if listener is None or not listener.path.exists():
            self._listener = None
            if listener is not None:
                await listener.close(None)
            listener = self._listener = await self._listen()
        self._watch.cancel()
        opened_before = listener.servicer.opened
        try:
            through = await registration.register(
                self._kubelet_dir,
                endpoint=listener.path.name,
                resource_name=self._name,
                options=OPTIONS,
            )
        except KubeletError:
            self._set_registered(False)
            if self._metrics is not None:
                self._metrics.count_registration(self._name, ok=False)
            raise
        self._set_registered(True)
        self._registered_at_ns = time.time_ns()
        self._registered_through = through
        self._watch.expect(listener.servicer, opened_before=opened_before)
        if self._metrics is not None:
            self._metrics.count_registration(self._name, ok=True)
        resource = self._snapshot.resource
        log.info(
            "registered %s with kubelet on %s (%d devices, %d healthy)",
            self._name,
            listener.path.name,
            len(resource.devices),
            resource.healthy_count,
        )

    async def _step_aside(self, listener: Listener) -> None:
        """Make kubelet forget the resource's client before `listener`'s streams end
        (handover.py), through `listener`'s socket or, when that is gone, a short-lived one."""
        if listener.path.exists():
            await handover.step_aside(
                self._kubelet_dir, listener.servicer, listener.path.name, self._name
            )
            return
        via = await self._listen()
        try:
            await handover.step_aside(self._kubelet_dir, via.servicer, via.path.name, self._name)
        finally:
            await via.close(None)

    def _no_stream(self, servicer: DevicePluginServicer) -> None:
        bound = self._watch.bound_s
        self._lost(servicer, f"opened no ListAndWatch stream within {bound:g} s of Register")

    def _lost(
        self, servicer: DevicePluginServicer, why: str = "ended its ListAndWatch stream"
    ) -> None:
        """Kubelet ended the last stream of `servicer`, or opened none after we registered it:
        it dropped our registration, if that is current."""
        listener = self._listener
        if listener is None or listener.servicer is not servicer or not self._registered:
            return
        self._set_registered(False)
        self._watch.cancel()
        log.info(
            "kubelet dropped the registration of %s on %s: it %s",
            self._name,
            listener.path.name,
            why,
        )
        if self._on_lost is not None:
            self._on_lost(self)

    def _set_registered(self, registered: bool) -> None:
        self._registered = registered
        if self._metrics is not None:
            self._metrics.set_registered(self._name, registered)
