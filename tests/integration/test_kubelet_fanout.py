"""Kubelet's ListAndWatch stream beside 50 other streams on the same socket, some never read.

Anything that can reach the socket may open streams (a debugging client, a monitoring agent, a
process that froze with its connection open), and kubelet's own stream must get every change at
once whatever they do: a list pushed on a reload, the final empty list of a resource that goes
away, and the new resource a rename registers right after. The other clients run in processes
of their own (`stream_clients.py`): 20 that read, 20 streams never read, and 10 readers whose
process is stopped (SIGSTOP) once they hold their first list, so their connections keep open
windows that nobody drains; on a reload their socket buffers fill up.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from daemon_harness import running
from support.observe import open_streams, servers

from sharing_plugin.config.model import Config
from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.kubelet.server import AllocateContext, ResourceServer
from sharing_plugin.plan import Plan
from sharing_plugin.sim.kubelet.simulator import KubeletSimulator

pytestmark = pytest.mark.subprocess

MakePlan = Callable[..., tuple[Plan, Config, Inventory]]
GPU = "nvidia.com/gpu"
CLIENTS = Path(__file__).with_name("stream_clients.py")
# 8 GPUs x 128 replicas: a 62 KiB list, so that a few pushes overflow a frozen reader's socket.
REPLICAS = 128
# Generous for a loaded CI machine; today a push takes ~10 ms here with or without the others.
WITHIN_S = 1.0


def time_slicing(replicas: int, *, rename: bool = False) -> dict[str, object]:
    return {
        "sharing": {
            "timeSlicing": {
                "renameByDefault": rename,
                "resources": [{"name": GPU, "replicas": replicas}],
            }
        }
    }


@asynccontextmanager
async def clients(socket: Path, *, readers: int, idle: int) -> AsyncIterator[int]:
    """A process holding `readers` + `idle` streams on `socket`; yields its pid once ready."""
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
        line = await asyncio.wait_for(child.stdout.readline(), 10.0)
        assert line == b"ready\n", line
        yield child.pid
    finally:
        child.kill()  # SIGKILL ends a stopped process too
        await child.wait()


@asynccontextmanager
async def other_streams(socket: Path) -> AsyncIterator[None]:
    """50 streams beside kubelet's: 20 read, 20 never read, 10 readers then frozen."""
    async with (
        clients(socket, readers=20, idle=20),
        clients(socket, readers=10, idle=0) as frozen,
    ):
        os.kill(frozen, signal.SIGSTOP)
        yield


async def timed(kubelet: KubeletSimulator, condition: Callable[[], bool]) -> float:
    started = time.perf_counter()
    await kubelet.wait_for(condition, timeout=10.0)
    return time.perf_counter() - started


async def test_a_push_reaches_kubelet_whatever_the_other_streams_do(
    kubelet_sim: KubeletSimulator, make_plan: MakePlan
) -> None:
    the_plan, cfg, inventory = make_plan(time_slicing(REPLICAS))
    resource = the_plan.resource(GPU)
    assert resource is not None
    server = ResourceServer(
        kubelet_dir=kubelet_sim.kubelet_dir,
        resource=resource,
        context=AllocateContext(flags=cfg.flags, inventory=inventory),
    )
    await server.start()
    await server.register()
    try:
        await kubelet_sim.wait_for(lambda: kubelet_sim.capacity(GPU) == 8 * REPLICAS)
        assert server.socket_path is not None
        async with other_streams(server.socket_path):
            assert open_streams(server) == 51
            for replicas in (REPLICAS + 1, REPLICAS + 2) * 3:
                new = make_plan(time_slicing(replicas))[0].resource(GPU)
                assert new is not None
                assert server.update(new)
                took = await timed(
                    kubelet_sim, lambda n=8 * replicas: kubelet_sim.capacity(GPU) == n
                )
                assert took < WITHIN_S, f"push to kubelet's stream took {took:.3f} s"
            started = time.perf_counter()
            await asyncio.wait_for(server.stop(), 5.0)
            took = time.perf_counter() - started
            assert took < WITHIN_S, f"stop took {took:.3f} s"
            assert server.socket_path is None
            # Kubelet's stream took the final empty list (its end alone would leave 1,024
            # devices counted, Unhealthy, for the grace period).
            await kubelet_sim.wait_for(lambda: kubelet_sim.capacity(GPU) == 0, timeout=2.0)
    finally:
        await server.stop()


CONFIG = """\
version: v1
sharing:
  timeSlicing:
    renameByDefault: {rename}
    resources:
    - name: nvidia.com/gpu
      replicas: {replicas}
"""


@pytest.mark.timeout(30)
async def test_a_rename_reaches_kubelet_whatever_the_old_sockets_streams_do(
    short_dir: Path,
) -> None:
    async with running(short_dir, CONFIG.format(rename="false", replicas=REPLICAS)) as run:
        socket = servers(run.daemon.supervisor)[GPU].socket_path
        assert socket is not None
        async with other_streams(socket):
            # Pushes while the frozen readers do not read: their sockets fill up.
            for replicas in (REPLICAS + 1, REPLICAS + 2, REPLICAS + 1):
                run.write(CONFIG.format(rename="false", replicas=replicas))
                await timed(run.kubelet, lambda n=8 * replicas: run.kubelet.capacity(GPU) == n)
            run.write(CONFIG.format(rename="true", replicas=REPLICAS))
            took = await timed(
                run.kubelet,
                lambda: (
                    run.kubelet.allocatable(f"{GPU}.shared") == 8 * REPLICAS
                    and run.kubelet.capacity(GPU) == 0
                ),
            )
            # The config watch's quiet period and the plan are in it too.
            assert took < WITHIN_S, f"rename reached kubelet after {took:.3f} s"
