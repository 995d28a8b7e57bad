"""Other ListAndWatch clients on a plugin socket, in a process of their own.

    python stream_clients.py SOCKET READERS IDLE

opens READERS streams that read every message and IDLE streams that are opened and never read,
each on its own connection, prints `ready` once every reader holds its first list, and runs
until killed. A test stops the process (SIGSTOP) to get readers that stop reading with their
connections' windows open, as a frozen process leaves them. Its own process, so that what the
clients do costs the plugin's event loop nothing, as on a node.
"""

from __future__ import annotations

import asyncio
import sys

import grpc

from sharing_plugin.kubelet.api.deviceplugin.v1beta1 import api_pb2 as dp
from sharing_plugin.kubelet.api.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc


async def main(socket: str, readers: int, idle: int) -> None:
    channels = [grpc.aio.insecure_channel(f"unix://{socket}") for _ in range(readers + idle)]
    calls = [dp_grpc.DevicePluginStub(c).ListAndWatch(dp.Empty()) for c in channels]
    first = [asyncio.Event() for _ in range(readers)]

    async def read(
        call: grpc.aio.UnaryStreamCall[dp.Empty, dp.ListAndWatchResponse], got: asyncio.Event
    ) -> None:
        async for _ in call:
            got.set()

    tasks = [asyncio.create_task(read(c, e)) for c, e in zip(calls[:readers], first, strict=True)]
    for call in calls[readers:]:
        await call.wait_for_connection()
    await asyncio.gather(*(e.wait() for e in first))
    print("ready", flush=True)
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
