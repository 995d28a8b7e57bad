"""The kubelet's side of DRA, in-process: its plugin watcher and the calls its DRA manager makes.

    async with DraKubeletSimulator(Path("/tmp/k")) as kubelet:
        plugin = await kubelet.wait_plugin("gpu.sharing-plugin.io")
        answer = await kubelet.prepare("gpu.sharing-plugin.io", [ClaimRef("default", "c", uid)])

What it copies from the kubelet (pkg/kubelet/pluginmanager and cm/dra), because a plugin must
cope with exactly this: sockets appearing in `plugins_registry/` are dialled and asked GetInfo;
a plugin of another type, without a name, or serving none of the DRA services this kubelet
knows is refused through NotifyRegistrationStatus with the reason; otherwise the plugin's
endpoint is dialled and the newest common service is used from then on. As since Kubernetes
1.33, a driver may register several instances (each its own registration socket: a rolling
update overlapping two pods): every one is kept, the newest is called, and a registration socket
that disappears deregisters that instance only, the newest left taking over; the last one gone
deregisters the driver (a real kubelet then deletes the driver's ResourceSlices of the node:
`on_deregistered` lets a test do the same). `restart()` forgets every plugin and
registers again whatever sockets it finds, as a starting kubelet does; `services` plays an
older kubelet (1.32-1.33 know only v1beta1).

Which devices a claim gets is the scheduler's decision in a cluster; the test allocator next to
this module stands in for it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from sharing_plugin.dra.api.constants import (
    DRA_PLUGIN_TYPE,
    PLUGINS_REGISTRY_DIR,
    SUPPORTED_SERVICES,
    V1_SERVICE,
)
from sharing_plugin.dra.api.dra.v1 import api_pb2 as v1
from sharing_plugin.dra.api.dra.v1 import api_pb2_grpc as v1_grpc
from sharing_plugin.dra.api.dra.v1beta1 import api_pb2 as v1beta1
from sharing_plugin.dra.api.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from sharing_plugin.dra.api.pluginregistration.v1 import api_pb2 as reg
from sharing_plugin.dra.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from sharing_plugin.dra.claims import ClaimRef
from sharing_plugin.kit.fswatch import Change, DirectoryWatch
from sharing_plugin.kit.lifecycle import Service

log = logging.getLogger(__name__)

DIAL_TIMEOUT_S = 5.0
_OPTIONS = [("grpc.default_authority", "localhost")]


@dataclass(frozen=True, slots=True)
class PreparedAnswer:
    """One claim's answer to NodePrepareResources, in plain values."""

    devices: tuple[dict[str, Any], ...] = ()  # {"requests", "pool", "device", "cdiIds"}
    error: str = ""


@dataclass(eq=False)
class DraPlugin:
    """A registered DRA plugin: its registration socket, endpoint and the service in use."""

    driver: str
    socket: Path
    endpoint: str
    service: str
    channel: grpc.aio.Channel = field(repr=False)


class DraKubeletSimulator(Service):
    """See the module docstring."""

    def __init__(
        self,
        kubelet_dir: Path,
        *,
        services: Sequence[str] = SUPPORTED_SERVICES,
        dial_timeout: float = DIAL_TIMEOUT_S,
        on_deregistered: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        self.registry = Path(kubelet_dir) / PLUGINS_REGISTRY_DIR
        self.services = tuple(services)
        self._dial_timeout = dial_timeout
        self._on_deregistered = on_deregistered
        self.plugins: dict[str, DraPlugin] = {}  # the instance called, per driver
        self.instances: dict[str, list[DraPlugin]] = {}  # every registered one, oldest first
        self.events: list[dict[str, Any]] = []  # what happened, in order (registrations, calls)
        self._changed = asyncio.Condition()
        self._watch: DirectoryWatch | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.registry.mkdir(parents=True, exist_ok=True)
        await self._start()

    async def close(self) -> None:
        await self._stop()

    async def _start(self) -> None:
        self._watch = DirectoryWatch(self.registry, debounce_s=0.005)
        await self._watch.__aenter__()
        for path in sorted(self.registry.iterdir()):
            await self._found(path)
        self._task = asyncio.create_task(self._follow(), name="dra-kubelet-sim-watch")

    async def _stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task})  # ends it without taking our own cancellation
        watch, self._watch = self._watch, None
        if watch is not None:
            await watch.__aexit__(None, None, None)
        for instances in self.instances.values():
            for plugin in instances:
                await plugin.channel.close(None)
        self.plugins.clear()
        self.instances.clear()

    async def restart(self) -> None:
        """A kubelet restart: every plugin forgotten, then registered again from the sockets."""
        await self._stop()
        self.events.append({"call": "restart"})
        await self._start()

    # -- registration ---------------------------------------------------------------------------

    async def _follow(self) -> None:
        assert self._watch is not None
        while True:
            for change in await self._watch.changes():
                if change.change is Change.ADDED:
                    await self._found(change.path)
                elif change.change is Change.DELETED:
                    await self._gone(change.path)

    async def _found(self, path: Path) -> None:
        known = (p.socket for instances in self.instances.values() for p in instances)
        if not path.name.endswith(".sock") or path in known:
            return
        try:
            await self._register(path)
        except (grpc.aio.AioRpcError, OSError) as exc:
            self.events.append({"call": "GetInfo", "socket": str(path), "error": str(exc)})
            log.warning("DRA kubelet simulator: cannot register %s: %s", path, exc)

    async def _register(self, path: Path) -> None:
        async with grpc.aio.insecure_channel(f"unix://{path}", options=_OPTIONS) as channel:
            stub = reg_grpc.RegistrationStub(channel)
            info = await stub.GetInfo(reg.InfoRequest(), timeout=self._dial_timeout)
            error = self._refusal(info)
            service = next((s for s in self.services if s in info.supported_versions), "")
            plugin: DraPlugin | None = None
            if error is None:
                endpoint = grpc.aio.insecure_channel(f"unix://{info.endpoint}", options=_OPTIONS)
                try:
                    async with asyncio.timeout(self._dial_timeout):
                        await endpoint.channel_ready()
                except TimeoutError:
                    await endpoint.close(None)
                    error = f"failed to dial {info.endpoint}: not ready in {self._dial_timeout} s"
                else:
                    plugin = DraPlugin(info.name, path, info.endpoint, service, endpoint)
            await stub.NotifyRegistrationStatus(
                reg.RegistrationStatus(plugin_registered=error is None, error=error or ""),
                timeout=self._dial_timeout,
            )
        self.events.append(
            {
                "call": "register",
                "driver": info.name,
                "versions": list(info.supported_versions),
                "service": service,
                "error": error,
            }
        )
        if plugin is not None:
            self.instances.setdefault(plugin.driver, []).append(plugin)
            self.plugins[plugin.driver] = plugin
        async with self._changed:
            self._changed.notify_all()

    def _refusal(self, info: reg.PluginInfo) -> str | None:
        if info.type != DRA_PLUGIN_TYPE:
            return f"plugin type {info.type!r} is not {DRA_PLUGIN_TYPE!r}"
        if not info.name:
            return "plugin name is empty"
        if not any(s in info.supported_versions for s in self.services):
            return (
                f"none of the versions supported by the plugin ({list(info.supported_versions)}) "
                f"is supported by this kubelet ({list(self.services)})"
            )
        return None

    async def _gone(self, path: Path) -> None:
        for driver, instances in list(self.instances.items()):
            for plugin in [p for p in instances if p.socket == path]:
                instances.remove(plugin)
                await plugin.channel.close(None)
                self.events.append({"call": "deregister", "driver": driver, "socket": str(path)})
            if instances:
                self.plugins[driver] = instances[-1]
                continue
            del self.instances[driver]
            if self.plugins.pop(driver, None) is not None and self._on_deregistered is not None:
                await self._on_deregistered(driver)
        async with self._changed:
            self._changed.notify_all()

    async def wait_plugin(self, driver: str, timeout: float = 5.0) -> DraPlugin:  # noqa: ASYNC109
        """The registered plugin of `driver`, once it is (TimeoutError otherwise)."""
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: driver in self.plugins)
        return self.plugins[driver]

    async def wait_gone(self, driver: str, timeout: float = 5.0) -> None:  # noqa: ASYNC109
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: driver not in self.plugins)

    # -- the DRA manager's calls ----------------------------------------------------------------

    def _plugin(self, driver: str) -> DraPlugin:
        plugin = self.plugins.get(driver)
        if plugin is None:
            raise LookupError(f"DRA driver {driver} is not registered")
        return plugin

    async def prepare(self, driver: str, claims: Sequence[ClaimRef]) -> dict[str, PreparedAnswer]:
        """NodePrepareResources with `claims`; the answer per claim UID."""
        plugin = self._plugin(driver)
        self.events.append({"call": "prepare", "driver": driver, "claims": [c.uid for c in claims]})
        if plugin.service == V1_SERVICE:
            response: Any = await v1_grpc.DRAPluginStub(plugin.channel).NodePrepareResources(
                v1.NodePrepareResourcesRequest(claims=[_v1_claim(c) for c in claims]),
                timeout=self._dial_timeout,
            )
        else:
            response = await v1beta1_grpc.DRAPluginStub(plugin.channel).NodePrepareResources(
                v1beta1.NodePrepareResourcesRequest(claims=[_v1beta1_claim(c) for c in claims]),
                timeout=self._dial_timeout,
            )
        return {
            uid: PreparedAnswer(
                devices=tuple(
                    {
                        "requests": list(d.request_names),
                        "pool": d.pool_name,
                        "device": d.device_name,
                        "cdiIds": list(d.cdi_device_ids),
                    }
                    for d in entry.devices
                ),
                error=entry.error,
            )
            for uid, entry in response.claims.items()
        }

    async def unprepare(self, driver: str, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """NodeUnprepareResources with `claims`; the error per claim UID ("" for success)."""
        plugin = self._plugin(driver)
        self.events.append(
            {"call": "unprepare", "driver": driver, "claims": [c.uid for c in claims]}
        )
        if plugin.service == V1_SERVICE:
            response: Any = await v1_grpc.DRAPluginStub(plugin.channel).NodeUnprepareResources(
                v1.NodeUnprepareResourcesRequest(claims=[_v1_claim(c) for c in claims]),
                timeout=self._dial_timeout,
            )
        else:
            response = await v1beta1_grpc.DRAPluginStub(plugin.channel).NodeUnprepareResources(
                v1beta1.NodeUnprepareResourcesRequest(claims=[_v1beta1_claim(c) for c in claims]),
                timeout=self._dial_timeout,
            )
        return {uid: entry.error for uid, entry in response.claims.items()}


def _v1_claim(ref: ClaimRef) -> v1.Claim:
    return v1.Claim(namespace=ref.namespace, name=ref.name, uid=ref.uid)


def _v1beta1_claim(ref: ClaimRef) -> v1beta1.Claim:
    return v1beta1.Claim(namespace=ref.namespace, name=ref.name, uid=ref.uid)
