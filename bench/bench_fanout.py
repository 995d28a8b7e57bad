"""Benchmark: a ListAndWatch push to kubelet's stream with 0 and with 50 other streams open.

One resource of 7,168 devices (a simulated DGX A100, 8 GPUs time-sliced 896 ways: a ~450 KB
list) served by a `ResourceServer` and registered with the in-package kubelet simulator, in
this process. Each round swaps in a plan with another replica count (`update()`) and times how
long until the simulator's stream holds the new list. Then the same with 50 more streams on the
resource's socket, opened by `tests/integration/stream_clients.py` in processes of their own:
20 that read every list, 20 that are opened and never read, and 10 readers whose process is
stopped (SIGSTOP) after their first list, so that their connections fill up and never drain.
Last, how long `stop()` takes with those 50 streams open (kubelet's stream gets the final empty
list; the others do not read it or cannot).

Run from the repository root: `.venv/bin/python bench/bench_fanout.py` (`--rounds N`, `--quick`,
`--json PATH` for `make bench`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from figures import FigureLog, add_json_option, ms, p50_p99  # noqa: E402
from support.observe import open_streams  # noqa: E402

from sharing_plugin.backends import backend_from_spec  # noqa: E402
from sharing_plugin.config.model import Config  # noqa: E402
from sharing_plugin.kubelet.server import AllocateContext, ResourceServer  # noqa: E402
from sharing_plugin.nvml import discover as nvml  # noqa: E402
from sharing_plugin.plan import ResourcePlan, plan  # noqa: E402
from sharing_plugin.sim.kubelet.simulator import KubeletSimulator  # noqa: E402

CLIENTS = ROOT / "tests" / "integration" / "stream_clients.py"
GPU = "nvidia.com/gpu"
REPLICAS = 896  # 8 x 896 = 7,168 devices
GOAL = "p50 and p99 <= 100 ms"
STOP_LIMIT_S = 10.0


def resource_plan(replicas: int) -> tuple[ResourcePlan, AllocateContext]:
    config = Config.model_validate(
        {
            "version": "v1",
            "sharing": {"timeSlicing": {"resources": [{"name": GPU, "replicas": replicas}]}},
        }
    )
    inventory = nvml.discover(backend_from_spec("simulated:dgx-a100-80gb"))
    resource = plan(config, inventory).resource(GPU)
    assert resource is not None
    return resource, AllocateContext(flags=config.flags, inventory=inventory)


@asynccontextmanager
async def clients(socket: Path, *, readers: int, idle: int, frozen: bool) -> AsyncIterator[None]:
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        str(CLIENTS),
        str(socket),
        str(readers),
        str(idle),
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert child.stdout is not None
        line = await asyncio.wait_for(child.stdout.readline(), 30.0)
        if line != b"ready\n":
            raise RuntimeError(f"stream clients did not start: {line!r}")
        if frozen:
            os.kill(child.pid, signal.SIGSTOP)
        yield
    finally:
        child.kill()
        await child.wait()


async def pushes(
    server: ResourceServer, kubelet: KubeletSimulator, plans: list[ResourcePlan], rounds: int
) -> list[float]:
    took: list[float] = []
    for n in range(rounds):
        new = plans[n % 2]
        started = time.perf_counter()
        server.update(new)
        count = len(new.devices)
        await kubelet.wait_for(lambda: kubelet.capacity(GPU) == count, timeout=30)  # noqa: B023
        took.append(time.perf_counter() - started)
        await asyncio.sleep(0.02)
    return took


def report(figures: FigureLog, devices: int, alone: list[float], crowded: list[float]) -> None:
    for label, samples in (("no other stream", alone), ("50 other streams", crowded)):
        p50, p99 = p50_p99(samples)
        worst = ms(max(samples))
        print(f"push -> kubelet holds the list, {label}: p50 {ms(p50)} p99 {ms(p99)} max {worst}")
    p50, p99 = p50_p99(crowded)
    b50, b99 = p50_p99(alone)
    figures.add(
        f"ListAndWatch push, {devices:,} devices, 50 other streams "
        "(20 read, 20 never read, 10 frozen) -> kubelet's stream holds the list",
        GOAL,
        f"p50 {ms(p50)}, p99 {ms(p99)} (n={len(crowded)}, max {ms(max(crowded))})",
        f"no other stream: p50 {ms(b50)}, p99 {ms(b99)}",
    )


async def main(rounds: int, figures: FigureLog) -> None:
    first, context = resource_plan(REPLICAS)
    plans = [resource_plan(REPLICAS + 1)[0], resource_plan(REPLICAS + 2)[0]]
    root = Path(tempfile.mkdtemp(prefix="bf", dir="/tmp"))
    try:
        async with KubeletSimulator(root) as kubelet:
            server = ResourceServer(kubelet_dir=root, resource=first, context=context)
            await server.start()
            await server.register()
            await kubelet.wait_for(lambda: kubelet.capacity(GPU) == len(first.devices))
            alone = await pushes(server, kubelet, plans, rounds)
            socket = server.socket_path
            assert socket is not None
            async with AsyncExitStack() as stack:
                await stack.enter_async_context(clients(socket, readers=20, idle=20, frozen=False))
                await stack.enter_async_context(clients(socket, readers=10, idle=0, frozen=True))
                assert open_streams(server) == 51
                crowded = await pushes(server, kubelet, plans, rounds)
                report(figures, len(first.devices), alone, crowded)
                started = time.perf_counter()
                try:
                    await asyncio.wait_for(server.stop(), STOP_LIMIT_S)
                    value = ms(time.perf_counter() - started)
                except TimeoutError:
                    value = f"did not return within {STOP_LIMIT_S:g} s"
                print(f"stop() with 50 other streams open: {value}")
                figures.add(
                    "stop() of that resource with the 50 other streams open",
                    "<= 0.7 s (STOP_GRACE_S + 2 x SHUTDOWN_BOUND_S)",
                    value,
                )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100, help="pushes of each kind")
    parser.add_argument("--quick", action="store_true", help="20 pushes of each kind")
    add_json_option(parser)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    asyncio.run(main(20 if args.quick else args.rounds, FigureLog(args.json)))
