"""A faithful kubelet, in-process, for tests, the demo, and trying a config on a laptop.

    async with KubeletSimulator(Path("/tmp/k")) as kubelet:
        ...  # a device plugin registers on /tmp/k/device-plugins/kubelet.sock
        await kubelet.wait_for(lambda: kubelet.allocatable("nvidia.com/gpu") == 8, timeout=2)
        pod = await kubelet.admit_pod("p", containers={"c": {"nvidia.com/gpu": 1}})

What it copies from kubelet's device manager (pkg/kubelet/cm/devicemanager), because the plugin
must cope with exactly this: Register checks the version and the extended resource name with
kubelet's messages, dials back (10 s) and takes the options from GetDevicePluginOptions; each
ListAndWatch message replaces the device set, "Healthy" by exact match; a stream that ends marks
every device Unhealthy, is never reopened, and after a grace period the resource drops to capacity
0; a new registration of a resource replaces the old endpoint. Pods are admitted like kubelet
does: GetPreferredAllocation when offered (its answer intersected with what is free), then one
Allocate per container and resource. `restart()` wipes `device-plugins/` like a starting kubelet
(everything but the checkpoint) and serves a fresh `kubelet.sock`; plugins must register again.
Two holds let a test play a slow kubelet: `pod_resources_hold` holds PodResources answers back
(taken before the hold), `allocate_hold` holds admission between the pick and Allocate.
It can drop a registration it has just accepted, before the plugin sees its stream, as the 1.32
kubelet does when a superseded stream of the same resource ends in that moment (`_drops`, set by
tests through tests/support/observe.py `drop_before_stream`).
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path

import grpc

from sharing_plugin.errors import KubeletError
from sharing_plugin.kit import unix_grpc
from sharing_plugin.kit.lifecycle import Service
from sharing_plugin.kit.unix_grpc import Context
from sharing_plugin.kubelet.api.constants import (
    DEVICE_PLUGINS_DIR,
    KUBELET_CHECKPOINT,
    KUBELET_SOCKET,
    POD_RESOURCES_DIR,
    SUPPORTED_VERSIONS,
)
from sharing_plugin.kubelet.api.deviceplugin.v1beta1 import api_pb2 as dp
from sharing_plugin.kubelet.api.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from sharing_plugin.kubelet.api.podresources.v1 import api_pb2_grpc as pr_grpc
from sharing_plugin.sim.kubelet.admission import Admission, AdmissionError
from sharing_plugin.sim.kubelet.endpoint import (
    DIAL_TIMEOUT_S,
    PluginEndpoint,
    Registration,
    ResourceDevices,
    is_extended_resource_name,
)
from sharing_plugin.sim.kubelet.hold import Hold
from sharing_plugin.sim.kubelet.pods import ContainerAllocation, PodAllocation, PodResourcesServicer

__all__ = [
    "AdmissionError",
    "ContainerAllocation",
    "KubeletSimulator",
    "PodAllocation",
    "Registration",
]

log = logging.getLogger(__name__)

# Kubelet keeps a stopped endpoint's devices (as Unhealthy) for 5 minutes before dropping them
# from capacity (devicemanager/types.go endpointStopGracePeriod).
ENDPOINT_STOP_GRACE_PERIOD_S = 300.0


class _Registration(dp_grpc.RegistrationServicer):
    def __init__(self, kubelet: KubeletSimulator) -> None:
        self._kubelet = kubelet

    async def Register(self, request: dp.RegisterRequest, context: Context) -> dp.Empty:
        refusal = await self._kubelet._register(request)
        if refusal is not None:
            # Kubelet returns a plain Go error, which reaches the plugin as UNKNOWN.
            await context.abort(grpc.StatusCode.UNKNOWN, refusal)
        return dp.Empty()


class KubeletSimulator(Service):
    """Serves Registration and PodResources under `kubelet_dir` and keeps kubelet's books."""

    def __init__(
        self,
        kubelet_dir: Path,
        *,
        grace_period: float = ENDPOINT_STOP_GRACE_PERIOD_S,
        dial_timeout: float = DIAL_TIMEOUT_S,
    ) -> None:
        self.kubelet_dir = Path(kubelet_dir).absolute()
        self.plugin_dir = self.kubelet_dir / DEVICE_PLUGINS_DIR
        self.registration_socket = self.plugin_dir / KUBELET_SOCKET
        self.pod_resources_socket = self.kubelet_dir / POD_RESOURCES_DIR / KUBELET_SOCKET
        for socket in (self.registration_socket, self.pod_resources_socket):
            unix_grpc.check_socket_path(socket, advice="use a shorter kubelet dir")
        self._grace_period = grace_period
        self._dial_timeout = dial_timeout
        self.registrations: list[Registration] = []
        # Kubelet-style log lines of what happened (registrations, refusals, stream ends).
        self.events: list[str] = []
        self._resources: dict[str, ResourceDevices] = {}
        # ListAndWatch messages received per resource, over every stream, for an observer to
        # count (an unchanged resource gets none on reload).
        self._messages: dict[str, int] = {}
        self._grace_timers: dict[str, asyncio.TimerHandle] = {}
        self._waiters: set[asyncio.Future[None]] = set()
        self._servers: dict[Path, grpc.aio.Server] = {}  # by socket
        self._drops: dict[str, int] = {}  # registrations to drop, by resource
        self.pod_resources_hold = Hold(self._notify)
        self.allocate_hold = Hold(self._notify)
        self._admission = Admission(
            self._resources, on_change=self._pods_changed, allocate_hold=self.allocate_hold
        )

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Clean `device-plugins/` as a starting kubelet does, then serve both sockets."""
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self.pod_resources_socket.parent.mkdir(parents=True, exist_ok=True)
        self._clean_plugin_dir()
        self._write_checkpoint()
        pod_resources = PodResourcesServicer(
            pods=lambda: self._admission.pods.values(),
            numa=lambda r: self._resources[r].numa if r in self._resources else {},
            devices=lambda: {r: list(s.health) for r, s in self._resources.items()},
            hold=self.pod_resources_hold,
        )
        self.pod_resources_socket.unlink(missing_ok=True)
        self._servers[self.pod_resources_socket] = await unix_grpc.serve(
            self.pod_resources_socket,
            lambda server: pr_grpc.add_PodResourcesListerServicer_to_server(pod_resources, server),
        )
        self._servers[self.registration_socket] = await unix_grpc.serve(
            self.registration_socket,
            lambda server: dp_grpc.add_RegistrationServicer_to_server(_Registration(self), server),
        )
        self._notify()

    async def close(self) -> None:
        """Stop serving, drop every plugin connection, remove our sockets."""
        servers, self._servers = self._servers, {}
        for server in servers.values():
            await server.stop(None)
        for timer in self._grace_timers.values():
            timer.cancel()
        self._grace_timers.clear()
        for state in self._resources.values():
            endpoint, state.endpoint = state.endpoint, None
            if endpoint is not None:
                await endpoint.close()
        # Go's net.UnixListener removes its socket file on close (and only a listener's own:
        # a start that failed to bind one leaves what was in the way).
        for socket in servers:
            socket.unlink(missing_ok=True)
        self._notify()

    stop = close  # what a test says to a kubelet that goes away

    async def restart(self) -> None:
        """A kubelet restart: plugins lose their connection and must register again.

        Pod allocations survive (kubelet reads them back from its checkpoint); device sets do
        not (a restarted kubelet knows a resource but advertises 0 until its plugin registers).
        """
        await self.close()
        self.registrations.clear()
        for state in self._resources.values():
            state.clear()
            state.stopped = False
        self.events.append("kubelet restarted")
        await self.start()

    def _clean_plugin_dir(self) -> None:
        # Kubelet's CleanupPluginDirectory: every non-directory entry but the checkpoint goes.
        for entry in self.plugin_dir.iterdir():
            if entry.name != KUBELET_CHECKPOINT and not entry.is_dir():
                entry.unlink(missing_ok=True)

    def _write_checkpoint(self) -> None:
        # A readable stand-in for kubelet's checkpoint (not byte-compatible: no checksum).
        entries = [
            {
                "PodUID": f"{pod.namespace}/{pod.name}",
                "ContainerName": a.container,
                "ResourceName": a.resource,
                "DeviceIDs": list(a.device_ids),
            }
            for pod in self._admission.pods.values()
            for a in pod.allocations
        ]
        registered = {r: sorted(s.health) for r, s in self._resources.items()}
        data = {"Data": {"PodDeviceEntries": entries, "RegisteredDevices": registered}}
        (self.plugin_dir / KUBELET_CHECKPOINT).write_text(json.dumps(data, indent=1) + "\n")

    # -- registration and ListAndWatch -------------------------------------------------------

    async def _register(self, request: dp.RegisterRequest) -> str | None:
        """Kubelet's Register; returns the refusal message, or None once the plugin is live."""
        resource = request.resource_name
        refusal: str | None = None
        if request.version not in SUPPORTED_VERSIONS:
            supported = ", ".join(f'"{v}"' for v in SUPPORTED_VERSIONS)
            refusal = (
                f'requested API version "{request.version}" is not supported by kubelet. '
                f"Supported version is [{supported}]"
            )
        elif not is_extended_resource_name(resource):
            refusal = f'the ResourceName "{resource}" is invalid'
        if refusal is not None:
            self._event(f"Bad registration request from device plugin {resource!r}: {refusal}")
            return refusal
        endpoint = PluginEndpoint(
            resource=resource,
            endpoint=request.endpoint,
            socket_path=self.plugin_dir / request.endpoint,
        )
        try:
            await endpoint.connect(self._dial_timeout)
        except KubeletError as exc:
            self._event(f"Error connecting to device plugin {resource!r}: {exc}")
            return str(exc)
        except BaseException:
            await endpoint.close()
            raise
        state = self._resources.setdefault(resource, ResourceDevices(resource))
        previous, state.endpoint = state.endpoint, endpoint
        state.stopped = False
        timer = self._grace_timers.pop(resource, None)
        if timer is not None:
            timer.cancel()
        self.registrations.append(Registration(resource, request.endpoint, endpoint.options))
        self._event(f"Registered device plugin {resource!r} on {request.endpoint}")
        if self._drops.get(resource, 0) > 0:
            self._drops[resource] -= 1
            endpoint.end_reason = "client disconnected before its ListAndWatch stream opened"
            self._on_end(endpoint)
            await endpoint.close()
        else:
            endpoint.start_watch(self._on_list, self._on_end)
        if previous is not None:
            await previous.close()
        self._notify()
        return None

    def _on_list(self, endpoint: PluginEndpoint, devices: list[dp.Device]) -> None:
        state = self._resources[endpoint.resource]
        if state.endpoint is endpoint:
            self._messages[endpoint.resource] = self._messages.get(endpoint.resource, 0) + 1
            state.replace(devices)
            self._write_checkpoint()
            self._notify()

    def _on_end(self, endpoint: PluginEndpoint) -> None:
        state = self._resources[endpoint.resource]
        self._event(
            f"ListAndWatch ended unexpectedly for device plugin {endpoint.resource!r}: "
            f"{endpoint.end_reason}"
        )
        if state.endpoint is not endpoint:
            return
        state.endpoint = None
        state.stopped = True
        state.mark_all_unhealthy()
        loop = asyncio.get_running_loop()
        self._grace_timers[endpoint.resource] = loop.call_later(
            self._grace_period, self._grace_expired, endpoint.resource
        )
        self._notify()

    def _grace_expired(self, resource: str) -> None:
        self._grace_timers.pop(resource, None)
        state = self._resources[resource]
        if state.stopped:
            state.clear()
            self._event(f"Device plugin {resource!r} stopped; resource removed from capacity")
            self._notify()

    def _event(self, line: str) -> None:
        log.info("kubelet simulator: %s", line)
        self.events.append(line)

    # -- what the node advertises --------------------------------------------------------------

    def resources(self) -> list[str]:
        """Every resource name kubelet has heard of, in registration order."""
        return list(self._resources)

    def capacity(self, resource: str) -> int:
        state = self._resources.get(resource)
        return len(state.health) if state else 0

    def allocatable(self, resource: str) -> int:
        state = self._resources.get(resource)
        return len(state.healthy_ids) if state else 0

    def devices(self, resource: str) -> dict[str, str]:
        """Device ID -> health string as last advertised (in the plugin's order)."""
        state = self._resources.get(resource)
        return dict(state.health) if state else {}

    def options(self, resource: str) -> dp.DevicePluginOptions | None:
        """Options of the live endpoint for `resource`, or None when none is connected."""
        state = self._resources.get(resource)
        return state.endpoint.options if state and state.endpoint else None

    async def wait_for(
        self,
        predicate: Callable[[], bool],
        timeout: float = 5.0,  # noqa: ASYNC109 -- the shape of asyncio.wait_for, for tests
    ) -> None:
        """Wait until `predicate()` holds; it is re-checked on every change, never polled."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                while not predicate():
                    waiter: asyncio.Future[None] = loop.create_future()
                    self._waiters.add(waiter)
                    try:
                        await waiter
                    finally:
                        self._waiters.discard(waiter)
        except TimeoutError:
            state = {r: self.devices(r) for r in self._resources}
            raise TimeoutError(
                f"kubelet simulator: condition not met within {timeout:g} s; "
                f"registrations={[(r.resource, r.endpoint) for r in self.registrations]} "
                f"devices={state} last events={self.events[-3:]}"
            ) from None

    def _notify(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    # -- pods ----------------------------------------------------------------------------------

    @property
    def allocate_seconds(self) -> collections.deque[float]:
        """How long each recent Allocate round trip took (successful ones), oldest first."""
        return self._admission.allocate_seconds

    @property
    def pods(self) -> dict[tuple[str, str], PodAllocation]:
        """(namespace, name) -> what the pod holds."""
        return dict(self._admission.pods)

    async def admit_pod(
        self,
        name: str,
        namespace: str = "default",
        *,
        containers: Mapping[str, Mapping[str, int]],
    ) -> PodAllocation:
        """Admit a pod like kubelet: pick devices, Allocate per container and resource.

        Raises AdmissionError (with kubelet's message) when a resource is unknown, too few
        healthy devices are free, or the plugin refuses; nothing is recorded then.
        """
        return await self._admission.admit(name, namespace, containers)

    def delete_pod(self, name: str, namespace: str = "default") -> None:
        """Free the pod's devices (the pod ended)."""
        self._admission.delete(name, namespace)

    def _pods_changed(self) -> None:
        self._write_checkpoint()
        self._notify()
