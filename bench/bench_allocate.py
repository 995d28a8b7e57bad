"""Benchmark: Allocate round trip through the real gRPC stack at 7,168 advertised devices.

A simulated DGX A100 (8 GPUs, each split into seven 1g.10gb MIG devices, discovered through the
NVML adapter) time-sliced 128 ways gives one resource of 8 x 7 x 128 = 7,168 devices. Its
ResourceServer is started and registered with the in-package kubelet simulator (so kubelet's
ListAndWatch stream is open, as in production), then a grpc.aio client calls Allocate over the
unix socket. Next to it, in the same process and event loop, a bare grpc.aio unary echo server
on another unix socket answers the same request bytes: the ratio of the two medians is what the
plugin itself adds (goal <= 1.5). Rounds of both alternate so drift affects both alike.

Run from the repository root: `.venv/bin/python bench/bench_allocate.py` (`--quick` for a short
run, `--json PATH` to also write the figures for `make bench`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
from figures import FigureLog, add_json_option, p50_p99, us

from sharing_plugin.backends import backend_from_spec
from sharing_plugin.config.model import Config
from sharing_plugin.kubelet.api.deviceplugin.v1beta1 import api_pb2 as dp
from sharing_plugin.kubelet.api.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from sharing_plugin.kubelet.server import AllocateContext, ResourceServer
from sharing_plugin.nvml import discover as nvml
from sharing_plugin.plan import plan
from sharing_plugin.sim.kubelet.simulator import KubeletSimulator

NODE = """\
gpus:
  - product: NVIDIA A100-SXM4-80GB
    count: 4
    numaNode: 0
    mig: {enabled: true, instances: [1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb]}
  - product: NVIDIA A100-SXM4-80GB
    count: 4
    numaNode: 1
    mig: {enabled: true, instances: [1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb]}
nvlink: all
"""
CONFIG = {
    "version": "v1",
    "flags": {"migStrategy": "mixed"},
    "sharing": {
        "timeSlicing": {"resources": [{"name": "nvidia.com/mig-1g.10gb", "replicas": 128}]}
    },
}
RESOURCE = "nvidia.com/mig-1g.10gb"
_ECHO_METHOD = "/bench.Echo/Echo"


async def _echo_server(socket: Path) -> grpc.aio.Server:
    async def echo(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        return request

    handler = grpc.method_handlers_generic_handler(
        "bench.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(echo)}
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    return server


async def _timed(call: Callable[[], Awaitable[object]], rounds: int, out: list[float]) -> None:
    for _ in range(rounds):
        start = time.perf_counter()
        await call()
        out.append(time.perf_counter() - start)


async def run(rounds: int, batch: int, log: FigureLog) -> None:
    work = Path(tempfile.mkdtemp(prefix="b", dir="/tmp"))
    try:
        node_file = work / "node.yaml"
        node_file.write_text(NODE)
        inventory = nvml.discover(backend_from_spec(f"simulated:{node_file}"))
        config = Config.model_validate(CONFIG)
        resource = plan(config, inventory).resource(RESOURCE)
        assert resource is not None and len(resource.devices) == 7168, resource
        async with KubeletSimulator(work / "kubelet") as kubelet:
            server = ResourceServer(
                kubelet_dir=kubelet.kubelet_dir,
                resource=resource,
                context=AllocateContext(flags=config.flags, inventory=inventory),
            )
            started = time.perf_counter()
            await server.start()
            await server.register()
            await kubelet.wait_for(lambda: kubelet.allocatable(RESOURCE) == 7168, timeout=10)
            registered_s = time.perf_counter() - started
            echo = await _echo_server(work / "echo.sock")
            try:
                await _compare(server, work / "echo.sock", resource.ids, rounds, batch, log)
            finally:
                await echo.stop(None)
                await server.stop()
        print(f"start -> registered, 7,168 devices seen by kubelet: {registered_s * 1e3:.1f} ms")
    finally:
        shutil.rmtree(work, ignore_errors=True)


async def _compare(
    server: ResourceServer,
    echo_socket: Path,
    ids: tuple[str, ...],
    rounds: int,
    batch: int,
    log: FigureLog,
) -> None:
    rng = random.Random(7)
    results: dict[str, list[float]] = {"allocate-1": [], "allocate-8": [], "echo": []}
    async with (
        grpc.aio.insecure_channel(f"unix://{server.socket_path}") as plugin_channel,
        grpc.aio.insecure_channel(f"unix://{echo_socket}") as echo_channel,
    ):
        stub = dp_grpc.DevicePluginStub(plugin_channel)
        echo = echo_channel.unary_unary(_ECHO_METHOD, None, None)

        def request(n: int) -> dp.AllocateRequest:
            return dp.AllocateRequest(
                container_requests=[dp.ContainerAllocateRequest(devices_ids=rng.sample(ids, n))]
            )

        one, eight = request(1), request(8)
        payload = one.SerializeToString()
        calls: dict[str, Callable[[], Awaitable[object]]] = {
            "allocate-1": lambda: stub.Allocate(one),
            "allocate-8": lambda: stub.Allocate(eight),
            "echo": lambda: echo(payload),
        }
        for call in calls.values():  # warm up connections and code paths
            await _timed(call, 50, [])
        done = 0
        while done < rounds:
            for name, call in calls.items():
                await _timed(call, batch, results[name])
            done += batch
    p50, p99 = {}, {}
    for name, samples in results.items():
        p50[name], p99[name] = p50_p99(samples)
        print(
            f"{name:11} n={len(samples):5}  p50 {p50[name] * 1e6:7.1f} us  "
            f"p99 {p99[name] * 1e6:7.1f} us"
        )
    ratio = p50["allocate-1"] / p50["echo"]
    print(f"ratio Allocate(1 ID) p50 / echo p50 = {ratio:.2f} (goal <= 1.5)")
    print(f"ratio Allocate(8 IDs) p50 / echo p50 = {p50['allocate-8'] / p50['echo']:.2f}")
    baseline = f"bare grpc.aio echo: p50 {us(p50['echo'])}, p99 {us(p99['echo'])}"
    for name, ids_text, goal in (("allocate-1", "1 ID", "<= 1.5"), ("allocate-8", "8 IDs", "")):
        log.add(
            f"Allocate round trip, {ids_text}, 7,168 devices: p50 / echo p50",
            goal,
            f"{p50[name] / p50['echo']:.2f} (p50 {us(p50[name])}, p99 {us(p99[name])}; "
            f"n={len(results[name])})",
            baseline,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a few hundred rounds only")
    parser.add_argument("--rounds", type=int, default=5000, help="calls of each kind")
    add_json_option(parser)
    args = parser.parse_args()
    rounds = 300 if args.quick else args.rounds
    # The simulator logs, as kubelet would, that the stream ended when the plugin stops.
    logging.basicConfig(level=logging.ERROR)
    asyncio.run(run(rounds, batch=100, log=FigureLog(args.json)))


if __name__ == "__main__":
    main()
