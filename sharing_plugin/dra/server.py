"""The DRA kubelet plugin's two sockets: its DRA service, then its registration.

    <kubelet-dir>/plugins/<driver>/dra-<instance>.sock           DRAPlugin v1 and v1beta1, and
                                                                 DRAResourceHealth v1alpha1
    <kubelet-dir>/plugins_registry/<driver>-<instance>-reg.sock  pluginregistration.Registration

The kubelet's plugin watcher notices a socket appearing in plugins_registry/, calls GetInfo
(type DRAPlugin, the driver name, the DRA socket's path and the services served), dials the DRA
socket and answers with NotifyRegistrationStatus; a socket disappearing deregisters that
instance. So the DRA service listens first and the registration socket is the last thing
created and the first removed. A kubelet that restarts finds the registration socket again by
itself.

`<instance>` is new at every start, so that two instances of the driver serve side by side while
a DaemonSet's rolling update (`maxSurge: 1`) overlaps them: since Kubernetes 1.33 the kubelet
keeps every registered instance of a driver, calls the newest, and falls back to another when
one deregisters (a fixed name would make the new instance replace the old one's socket, and the
kubelet deregister the driver meanwhile). At start, sockets of this driver's names that nobody
listens on (a killed run's, the fixed names of earlier releases included) are removed; live ones
are another instance's and stay.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc

from sharing_plugin.dra.api.constants import (
    DRA_PLUGIN_TYPE,
    DRA_SOCKET_PREFIX,
    HEALTH_V1ALPHA1_SERVICE,
    PLUGINS_DIR,
    PLUGINS_REGISTRY_DIR,
    REGISTRATION_SOCKET_SUFFIX,
    SOCKET_SUFFIX,
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


_INSTANCE_BYTES = 4  # 8 hex digits: unique enough for the instances one node overlaps


def new_instance() -> str:
    """A fresh instance name for one start of the plugin."""
    return secrets.token_hex(_INSTANCE_BYTES)


def registration_socket(kubelet_dir: Path, driver: str, instance: str) -> Path:
    name = f"{driver}-{instance}{REGISTRATION_SOCKET_SUFFIX}"
    return Path(kubelet_dir) / PLUGINS_REGISTRY_DIR / name


def dra_socket(kubelet_dir: Path, driver: str, instance: str) -> Path:
    return plugin_dir(kubelet_dir, driver) / f"{DRA_SOCKET_PREFIX}-{instance}{SOCKET_SUFFIX}"


def plugin_dir(kubelet_dir: Path, driver: str) -> Path:
    """The driver's own directory: its DRA sockets and its checkpoint."""
    return Path(kubelet_dir) / PLUGINS_DIR / driver


def instance_sockets(kubelet_dir: Path, driver: str) -> list[Path]:
    """The sockets of every instance of `driver` there are (registration and DRA), fixed
    names of earlier releases included."""
    registration = re.compile(
        rf"{re.escape(driver)}(-[0-9a-f]{{{2 * _INSTANCE_BYTES}}})?"
        rf"{re.escape(REGISTRATION_SOCKET_SUFFIX)}"
    )
    dra = re.compile(
        rf"{DRA_SOCKET_PREFIX}(-[0-9a-f]{{{2 * _INSTANCE_BYTES}}})?{re.escape(SOCKET_SUFFIX)}"
    )
    found: list[Path] = []
    for directory, pattern in (
        (Path(kubelet_dir) / PLUGINS_REGISTRY_DIR, registration),
        (plugin_dir(kubelet_dir, driver), dra),
    ):
        try:
            names = sorted(p.name for p in directory.iterdir())
        except FileNotFoundError:
            continue
        found += [directory / n for n in names if pattern.fullmatch(n)]
    return found


def check_socket_paths(kubelet_dir: Path, driver: str) -> None:
    """Raise KubeletError when a socket path would not fit a unix socket address."""
    longest = "f" * 2 * _INSTANCE_BYTES
    for path in (
        registration_socket(kubelet_dir, driver, longest),
        dra_socket(kubelet_dir, driver, longest),
    ):
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
        instance: str | None = None,
    ) -> None:
        """`on_registered` is called after every registration the kubelet confirms (a
        restarted kubelet registers the plugin again). With `health`, the DRA socket also
        serves device health, and the registration says so. `instance` names this start's
        sockets (a new one when not given)."""
        self.driver = driver
        self.instance = instance or new_instance()
        self._kubelet_dir = Path(kubelet_dir)
        self.endpoint = dra_socket(kubelet_dir, driver, self.instance)
        self.registration_path = registration_socket(kubelet_dir, driver, self.instance)
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
        others = self._remove_stale()
        if others:
            log.info(
                "another instance of DRA driver %s serves (%s): both serve until it stops",
                self.driver,
                ", ".join(p.name for p in others),
            )
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

    def others_serving(self) -> list[Path]:
        """The registration sockets of other instances of this driver that answer."""
        return [
            path
            for path in instance_sockets(self._kubelet_dir, self.driver)
            if path.parent.name == PLUGINS_REGISTRY_DIR
            and path not in (self.registration_path, self.endpoint)
            and unix_grpc.probe(path) is unix_grpc.SocketState.LIVE
        ]

    async def others_leaving(self, on_left: Callable[[list[Path]], None], *, poll_s: float) -> None:
        """Call `on_left(their sockets)` whenever other instances that served stop serving
        (their registration sockets gone or no longer answering), looking every `poll_s`;
        until cancelled."""
        serving = set(self.others_serving())
        while True:
            await asyncio.sleep(poll_s)
            now = set(self.others_serving())
            if left := serving - now:
                on_left(sorted(left))
            serving = now

    def _remove_stale(self) -> list[Path]:
        """Remove the sockets of this driver's instances that nobody listens on; the live
        registration sockets of other instances."""
        for path in instance_sockets(self._kubelet_dir, self.driver):
            if unix_grpc.probe(path) is unix_grpc.SocketState.STALE:
                path.unlink(missing_ok=True)
                log.info("removed the stale socket %s of an earlier run", path)
        return self.others_serving()

    def _add_dra_services(self, server: grpc.aio.Server) -> None:
        v1_grpc.add_DRAPluginServicer_to_server(DraServicerV1(self._preparer), server)
        v1beta1_grpc.add_DRAPluginServicer_to_server(DraServicerV1Beta1(self._preparer), server)
        if self._health is not None:
            health_grpc.add_DRAResourceHealthServicer_to_server(self._health, server)

    def _add_registration(self, server: grpc.aio.Server) -> None:
        reg_grpc.add_RegistrationServicer_to_server(self.registration, server)

    async def _listen(self, path: Path, add: Callable[[grpc.aio.Server], None]) -> grpc.aio.Server:
        path.parent.mkdir(parents=True, exist_ok=True)
        if unix_grpc.probe(path) is not unix_grpc.SocketState.MISSING:
            raise KubeletError(f"{path} exists: another instance took this instance's name")
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
