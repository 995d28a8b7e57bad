"""A minimal device plugin for testing the kubelet simulator over real unix sockets.

It records every call it gets, lets the test push device lists or end the ListAndWatch stream,
and answers GetPreferredAllocation with a test-chosen function.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import grpc

from sharing_plugin.kubelet.api.deviceplugin.v1beta1 import api_pb2 as dp
from sharing_plugin.kubelet.api.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc

Message = Any


def devices(
    ids: Sequence[str], health: str = "Healthy", numa: int | None = None
) -> list[dp.Device]:
    topology = dp.TopologyInfo(nodes=[dp.NUMANode(ID=numa)]) if numa is not None else None
    return [dp.Device(ID=i, health=health, topology=topology) for i in ids]


def reversed_preference(request: dp.ContainerPreferredAllocationRequest) -> list[str]:
    return list(reversed(request.available_deviceIDs))[: request.allocation_size]


class FakeDevicePlugin(dp_grpc.DevicePluginServicer):
    def __init__(
        self,
        plugin_dir: Path,
        *,
        resource: str = "example.com/gpu",
        endpoint: str = "fake.sock",
        initial: list[dp.Device] | None = None,
        preferred: Callable[[dp.ContainerPreferredAllocationRequest], list[str]] | None = None,
        pre_start_required: bool = False,
    ) -> None:
        self.plugin_dir = plugin_dir
        self.resource = resource
        self.endpoint = endpoint
        self.preferred = preferred
        self.pre_start_required = pre_start_required
        self.calls: list[tuple[str, Message]] = []
        self.streams_ended = 0
        self._updates: asyncio.Queue[list[dp.Device] | None] = asyncio.Queue()
        if initial is not None:
            self._updates.put_nowait(initial)
        self._server: grpc.aio.Server | None = None

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    def push(self, devices: list[dp.Device]) -> None:
        self._updates.put_nowait(devices)

    def end_stream(self) -> None:
        self._updates.put_nowait(None)

    async def start(self) -> None:
        self._server = grpc.aio.server()
        dp_grpc.add_DevicePluginServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix://{self.plugin_dir / self.endpoint}")
        await self._server.start()

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(None)
            self._server = None

    async def register(
        self, *, version: str = "v1beta1", resource: str | None = None, endpoint: str | None = None
    ) -> None:
        """Register with the kubelet; the request's options deliberately say nothing."""
        async with grpc.aio.insecure_channel(f"unix://{self.plugin_dir / 'kubelet.sock'}") as ch:
            await dp_grpc.RegistrationStub(ch).Register(
                dp.RegisterRequest(
                    version=version,
                    endpoint=endpoint or self.endpoint,
                    resource_name=resource or self.resource,
                    options=dp.DevicePluginOptions(),
                ),
                timeout=15,
            )

    async def __aenter__(self) -> FakeDevicePlugin:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- DevicePlugin service ------------------------------------------------------------------

    async def GetDevicePluginOptions(
        self, request: dp.Empty, context: grpc.aio.ServicerContext[Any, Any]
    ) -> dp.DevicePluginOptions:
        self.calls.append(("GetDevicePluginOptions", request))
        return dp.DevicePluginOptions(
            pre_start_required=self.pre_start_required,
            get_preferred_allocation_available=self.preferred is not None,
        )

    async def ListAndWatch(
        self, request: dp.Empty, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[dp.ListAndWatchResponse]:
        self.calls.append(("ListAndWatch", request))
        try:
            while (update := await self._updates.get()) is not None:
                yield dp.ListAndWatchResponse(devices=update)
        finally:
            self.streams_ended += 1

    async def GetPreferredAllocation(
        self, request: dp.PreferredAllocationRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> dp.PreferredAllocationResponse:
        self.calls.append(("GetPreferredAllocation", request))
        assert self.preferred is not None
        return dp.PreferredAllocationResponse(
            container_responses=[
                dp.ContainerPreferredAllocationResponse(deviceIDs=self.preferred(r))
                for r in request.container_requests
            ]
        )

    async def Allocate(
        self, request: dp.AllocateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> dp.AllocateResponse:
        self.calls.append(("Allocate", request))
        for r in request.container_requests:
            if "bad" in r.devices_ids:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "unknown device 'bad'")
        return dp.AllocateResponse(
            container_responses=[
                dp.ContainerAllocateResponse(envs={"VISIBLE": ",".join(r.devices_ids)})
                for r in request.container_requests
            ]
        )

    async def PreStartContainer(
        self, request: dp.PreStartContainerRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> dp.PreStartContainerResponse:
        self.calls.append(("PreStartContainer", request))
        return dp.PreStartContainerResponse()
