"""The DRA kubelet plugin's two sockets: its DRA service, then its registration.

    <kubelet-dir>/plugins/<driver>/dra.sock              DRAPlugin v1 and v1beta1, and
                                                         DRAResourceHealth v1alpha1
    <kubelet-dir>/plugins_registry/<driver>-reg.sock     pluginregistration.Registration

The kubelet's plugin watcher notices a socket appearing in plugins_registry/, calls GetInfo
(type DRAPlugin, the driver name, the DRA socket's path and the services served), dials the DRA
socket and answers with NotifyRegistrationStatus; a socket disappearing deregisters the plugin
(and makes the kubelet delete the node's ResourceSlices of the driver). So the DRA service
listens first and the registration socket is the last thing created and the first removed.
Both names are fixed (the kubelet's own helper library uses the same), which is why a socket
left by a killed run is removed at start when nobody listens on it; one that answers belongs to
a running instance and is an error. A kubelet that restarts finds the registration socket
again by itself.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc

from sharing_plugin.dra.api.constants import (
    DRA_PLUGIN_TYPE,
    DRA_SOCKET,
    HEALTH_V1ALPHA1_SERVICE,
    PLUGINS_DIR,
    PLUGINS_REGISTRY_DIR,
    REGISTRATION_SOCKET_SUFFIX,
    SUPPORTED_SERVICES,
)
from sharing_plugin.dra.api.dra.v1 import api_pb2 as v1
from sharing_plugin.dra.api.dra.v1 import api_pb2_grpc as v1_grpc
from sharing_plugin.dra.api.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from sharing_plugin.dra.api.dra_health.v1alpha1 import api_pb2_grpc as health_grpc
from sharing_plugin.dra.api.pluginregistration.v1 import api_pb2 as reg
from sharing_plugin.dra.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from sharing_plugin.dra.health import DeviceHealthServicer
from sharing_plugin.dra.prepare import ClaimPreparer
from sharing_plugin.dra.servicer import DraServicerV1, DraServicerV1Beta1
from sharing_plugin.errors import KubeletError
from sharing_plugin.kit import unix_grpc
from sharing_plugin.kit.unix_grpc import Context

log = logging.getLogger(__name__)


def registration_socket(kubelet_dir: Path, driver: str) -> Path:
    return Path(kubelet_dir) / PLUGINS_REGISTRY_DIR / f"{driver}{REGISTRATION_SOCKET_SUFFIX}"


def dra_socket(kubelet_dir: Path, driver: str) -> Path:
    return Path(kubelet_dir) / PLUGINS_DIR / driver / DRA_SOCKET


def plugin_dir(kubelet_dir: Path, driver: str) -> Path:
    """The driver's own directory: its DRA socket and its checkpoint."""
    return Path(kubelet_dir) / PLUGINS_DIR / driver


def check_socket_paths(kubelet_dir: Path, driver: str) -> None:
    """Raise KubeletError when a socket path would not fit a unix socket address."""
    for path in (registration_socket(kubelet_dir, driver), dra_socket(kubelet_dir, driver)):
        unix_grpc.check_socket_path(path, advice="use a shorter --kubelet-dir or --driver-name")


class RegistrationServicer(reg_grpc.RegistrationServicer):
    """Tells the kubelet's plugin watcher who we are, and hears its verdict."""

    def __init__(
        self,
        *,
        driver: str,
        endpoint: Path,
        versions: Sequence[str],
        on_registered: Callable[[], None] = lambda: None,
    ) -> None:
        self._info = reg.PluginInfo(
            type=DRA_PLUGIN_TYPE, name=driver, endpoint=str(endpoint), supported_versions=versions
        )
        self._on_registered = on_registered
        self.registered = asyncio.Event()
        self.error: str | None = None
        self.calls = 0  # GetInfo calls: one per registration (a kubelet restart makes another)

    async def GetInfo(self, request: reg.InfoRequest, context: Context) -> reg.PluginInfo:
        self.calls += 1
        return self._info

    async def NotifyRegistrationStatus(
        self, request: reg.RegistrationStatus, context: Context
    ) -> reg.RegistrationStatusResponse:
        if request.plugin_registered:
            self.error = None
            self.registered.set()
            log.info("registered with the kubelet as DRA driver %s", self._info.name)
            self._on_registered()
        else:
            self.error = request.error
            self.registered.clear()
            log.error("the kubelet refused DRA driver %s: %s", self._info.name, request.error)
        return reg.RegistrationStatusResponse()


class DraPluginServer:
    """Serves one driver's DRA service and registration; see the module docstring."""

    def __init__(
        self,
        *,
        kubelet_dir: Path,
        driver: str,
        preparer: ClaimPreparer,
        versions: Sequence[str] = SUPPORTED_SERVICES,
        on_registered: Callable[[], None] = lambda: None,
        health: DeviceHealthServicer | None = None,
    ) -> None:
        """`on_registered` is called after every registration the kubelet confirms (a
        restarted kubelet registers the plugin again). With `health`, the DRA socket also
        serves device health, and the registration says so."""
        self.driver = driver
        self._kubelet_dir = Path(kubelet_dir)
        self.endpoint = dra_socket(kubelet_dir, driver)
        self.registration_path = registration_socket(kubelet_dir, driver)
        self._preparer = preparer
        self._health = health
        if health is not None:
            versions = (*versions, HEALTH_V1ALPHA1_SERVICE)
        self.registration = RegistrationServicer(
            driver=driver, endpoint=self.endpoint, versions=versions, on_registered=on_registered
        )
        self._dra: grpc.aio.Server | None = None
        self._reg: grpc.aio.Server | None = None

    @property
    def registered(self) -> bool:
        return self.registration.registered.is_set()

    async def start(self) -> None:
        """Listen on the DRA socket, check it answers, then offer the registration socket."""
        check_socket_paths(self._kubelet_dir, self.driver)
        self._dra = await self._listen(self.endpoint, self._add_dra_services)
        try:
            await self._check_answers()
            self._reg = await self._listen(self.registration_path, self._add_registration)
        except BaseException:
            await self.stop()
            raise
        log.info(
            "DRA driver %s serving on %s, registration offered on %s",
            self.driver,
            self.endpoint,
            self.registration_path,
        )

    async def stop(self) -> None:
        """Withdraw the registration socket, then stop the DRA service; idempotent."""
        for attr, path in (("_reg", self.registration_path), ("_dra", self.endpoint)):
            server: grpc.aio.Server | None = getattr(self, attr)
            setattr(self, attr, None)
            if server is None:
                continue
            # Removed before the server stops, so the kubelet stops dialling a closing socket.
            path.unlink(missing_ok=True)
            await server.stop(unix_grpc.STOP_GRACE_S)
        self.registration.registered.clear()

    def _add_dra_services(self, server: grpc.aio.Server) -> None:
        v1_grpc.add_DRAPluginServicer_to_server(DraServicerV1(self._preparer), server)
        v1beta1_grpc.add_DRAPluginServicer_to_server(DraServicerV1Beta1(self._preparer), server)
        if self._health is not None:
            health_grpc.add_DRAResourceHealthServicer_to_server(self._health, server)

    def _add_registration(self, server: grpc.aio.Server) -> None:
        reg_grpc.add_RegistrationServicer_to_server(self.registration, server)

    async def _listen(self, path: Path, add: Callable[[grpc.aio.Server], None]) -> grpc.aio.Server:
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale(path)
        return await unix_grpc.serve(path, add, advice="check that the directory is writable")

    async def _check_answers(self) -> None:
        await unix_grpc.check_answers(
            self.endpoint,
            lambda channel: v1_grpc.DRAPluginStub(channel).NodePrepareResources(
                v1.NodePrepareResourcesRequest(),
                timeout=unix_grpc.READY_TIMEOUT_S,
                wait_for_ready=True,
            ),
            who=f"DRA driver {self.driver}",
        )


def _remove_stale(path: Path) -> None:
    """Remove a socket a killed run left at `path`; refuse one somebody still listens on."""
    state = unix_grpc.probe(path)
    if state is unix_grpc.SocketState.MISSING:
        return
    if state is unix_grpc.SocketState.NOT_A_SOCKET:
        raise KubeletError(f"{path} exists and is not a socket: remove it")
    if state is unix_grpc.SocketState.STALE:
        path.unlink(missing_ok=True)
        log.info("removed the stale socket %s of an earlier run", path)
        return
    raise KubeletError(
        f"another process serves {path}: is a second instance of this DRA driver running?"
    )
