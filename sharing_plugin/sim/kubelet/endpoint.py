"""The simulated kubelet's side of one registered device plugin: dial back, options, ListAndWatch.

Kubelet's device manager (pkg/kubelet/cm/devicemanager) keeps, per resource name, the device set
from the last ListAndWatch message, and a client connection to the plugin that registered the
resource last. This module holds both, separated the way kubelet separates them: the device set
(`ResourceDevices`) outlives a connection (`PluginEndpoint`), so a plugin that re-registers keeps
its devices until its new stream sends a list, and a stream that ends leaves the devices in place
as Unhealthy until a grace period removes them.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import grpc

from sharing_plugin.errors import KubeletError
from sharing_plugin.kubelet.api.constants import HEALTHY, KUBELET_MAX_RECEIVE_MESSAGE_BYTES
from sharing_plugin.kubelet.api.deviceplugin.v1beta1 import api_pb2 as dp
from sharing_plugin.kubelet.api.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc

log = logging.getLogger(__name__)

# Kubelet dials a registering plugin with a 10 s deadline (plugin/v1beta1/client.go `dial`).
DIAL_TIMEOUT_S: Final = 10.0

_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*")
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


def is_extended_resource_name(name: str) -> bool:
    """Kubelet's `v1helper.IsExtendedResourceName`, which Register applies to resource_name.

    Not native (it has a '/' and no `kubernetes.io/`), not a quota name (`requests.` prefix), and
    `requests.<name>` is a qualified name: a DNS-1123 subdomain prefix (<= 253 characters), one
    '/', then a name of at most 63 alphanumerics, '-', '_' or '.', alphanumeric at both ends.
    """
    if "/" not in name or "kubernetes.io/" in name or name.startswith("requests."):
        return False
    parts = f"requests.{name}".split("/")
    if len(parts) != 2:
        return False
    prefix, short = parts
    return (
        0 < len(prefix) <= 253
        and _DNS1123_SUBDOMAIN.fullmatch(prefix) is not None
        and 0 < len(short) <= 63
        and _QUALIFIED_NAME.fullmatch(short) is not None
    )


@dataclass
class ResourceDevices:
    """Kubelet's view of one resource: the last advertised devices and who advertises them."""

    name: str
    health: dict[str, str] = field(default_factory=dict)
    numa: dict[str, tuple[int, ...]] = field(default_factory=dict)
    endpoint: PluginEndpoint | None = None
    # Set when the endpoint's stream ended; cleared by a new registration.
    stopped: bool = False

    def replace(self, devices: list[dp.Device]) -> None:
        """Each ListAndWatch message replaces the whole set; "Healthy" by exact match only."""
        self.health = {d.ID: d.health for d in devices}
        self.numa = {d.ID: tuple(n.ID for n in d.topology.nodes) for d in devices}

    def mark_all_unhealthy(self) -> None:
        self.health = dict.fromkeys(self.health, "Unhealthy")

    def clear(self) -> None:
        self.health = {}
        self.numa = {}

    @property
    def healthy_ids(self) -> list[str]:
        return [i for i, h in self.health.items() if h == HEALTHY]


@dataclass(frozen=True, slots=True)
class Registration:
    """One accepted Register call, as tests and the demo look at it."""

    resource: str
    endpoint: str
    options: dp.DevicePluginOptions


class PluginEndpoint:
    """A client connection to one registered plugin socket, and its ListAndWatch consumer."""

    def __init__(self, *, resource: str, endpoint: str, socket_path: Path) -> None:
        self.resource = resource
        self.endpoint = endpoint
        self.socket_path = socket_path
        self.options = dp.DevicePluginOptions()
        # Kubelet's clients keep grpc-go's 4 MiB receive limit: a larger ListAndWatch message
        # fails the stream with RESOURCE_EXHAUSTED, which ends it like a plugin crash would.
        self._channel = grpc.aio.insecure_channel(
            f"unix://{socket_path}",
            options=[
                ("grpc.max_receive_message_length", KUBELET_MAX_RECEIVE_MESSAGE_BYTES),
                ("grpc.default_authority", "localhost"),
            ],
        )
        self.stub = dp_grpc.DevicePluginStub(self._channel)
        self._watch: asyncio.Task[None] | None = None
        self.end_reason: str | None = None

    async def connect(self, deadline_s: float) -> None:
        """Dial (blocking until the socket answers, like grpc.WithBlock) and fetch the options.

        Kubelet takes the options from GetDevicePluginOptions, not from the RegisterRequest.
        Errors carry kubelet's wording, since Register returns them to the plugin verbatim.
        """
        try:
            await asyncio.wait_for(self._channel.channel_ready(), deadline_s)
        except TimeoutError:
            await self.close()
            raise KubeletError(
                f"failed to dial device plugin: context deadline exceeded "
                f"(nothing answered on {self.socket_path} within {deadline_s:g} s)"
            ) from None
        try:
            self.options = await self.stub.GetDevicePluginOptions(dp.Empty(), timeout=deadline_s)
        except grpc.aio.AioRpcError as exc:
            await self.close()
            raise KubeletError(
                f"failed to get device plugin options: {exc.code().name}: {exc.details()}"
            ) from exc

    def start_watch(
        self,
        on_list: Callable[[PluginEndpoint, list[dp.Device]], None],
        on_end: Callable[[PluginEndpoint], None],
    ) -> None:
        """Consume ListAndWatch in a task until the stream ends or `close()` cancels it."""
        self._watch = asyncio.create_task(
            self._consume(on_list, on_end), name=f"kubelet-sim:ListAndWatch:{self.resource}"
        )

    async def _consume(
        self,
        on_list: Callable[[PluginEndpoint, list[dp.Device]], None],
        on_end: Callable[[PluginEndpoint], None],
    ) -> None:
        call = self.stub.ListAndWatch(dp.Empty())
        try:
            async for response in call:
                on_list(self, list(response.devices))
            self.end_reason = "stream finished by the device plugin"
        except grpc.aio.AioRpcError as exc:
            self.end_reason = f"{exc.code().name}: {exc.details()}"
        # Kubelet does not reconnect: the plugin has to register again (plugin/v1beta1 client.go).
        log.warning(
            "ListAndWatch ended unexpectedly for device plugin %s (%s): %s",
            self.resource,
            self.endpoint,
            self.end_reason,
        )
        await self._channel.close(None)
        on_end(self)

    async def close(self) -> None:
        """Cancel the stream consumer and close the connection (kubelet's Disconnect)."""
        watch, self._watch = self._watch, None
        if watch is not None and watch is not asyncio.current_task():
            watch.cancel()
            try:
                await watch
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise
        await self._channel.close(None)
