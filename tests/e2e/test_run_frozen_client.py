"""SIGTERM ends `sharing-plugin run` even while a client of its socket is frozen.

A process stopped (SIGSTOP) with a ListAndWatch stream open never reads again; grpc cannot
finish shutting down the server that stream belongs to, and an interpreter that waited for it at
exit would never end: the DaemonSet's pod would sit in Terminating until its grace period ran
out and kubelet killed it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest
from plugin_process import PluginProcess

from sharing_plugin.sim.kubelet.simulator import KubeletSimulator

pytestmark = pytest.mark.subprocess

GPU = "nvidia.com/gpu"
CLIENTS = Path(__file__).parent.parent / "integration" / "stream_clients.py"
# 8 GPUs x 128 replicas: a 62 KiB list, so that a few pushes fill a frozen reader's window.
CONFIG = """\
version: v1
sharing:
  timeSlicing:
    resources:
      - name: nvidia.com/gpu
        replicas: {}
"""
START_S = 10.0  # generous for a loaded CI machine


def write_config(path: Path, replicas: int) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(CONFIG.format(replicas), encoding="utf-8")
    tmp.replace(path)


async def test_sigterm_ends_run_while_a_client_of_its_socket_is_frozen(
    kubelet: KubeletSimulator, short_dir: Path
) -> None:
    config = short_dir / "config.yaml"
    write_config(config, 128)
    args = [
        "--config", str(config),
        "--gpus", "simulated:dgx-a100-80gb",
        "--kubelet-dir", str(short_dir),
        "--metrics-address", "off",
    ]  # fmt: skip
    async with PluginProcess(args) as plugin:
        await kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 8 * 128, timeout=START_S)
        (socket,) = kubelet.plugin_dir.glob("sharing-*.sock")
        child = await asyncio.create_subprocess_exec(
            sys.executable, str(CLIENTS), str(socket), "4", "0", stdout=asyncio.subprocess.PIPE
        )
        try:
            assert child.stdout is not None
            assert await asyncio.wait_for(child.stdout.readline(), 10.0) == b"ready\n"
            os.kill(child.pid, signal.SIGSTOP)
            # Pushes its readers never take: their windows fill up.
            for replicas in (129, 130, 131, 132):
                write_config(config, replicas)
                await kubelet.wait_for(
                    lambda n=8 * replicas: kubelet.capacity(GPU) == n, timeout=5.0
                )
            assert await plugin.stop(signal.SIGTERM, timeout=5.0) == 0
            assert "does not read what was sent to it" in plugin.stderr()
            assert "task(s) of a stopped server unfinished" in plugin.stderr()
        finally:
            child.kill()  # SIGKILL ends a stopped process too
            await child.wait()
