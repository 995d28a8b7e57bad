"""`sharing-plugin run` and `sharing-plugin mps-control` as child processes, as a pod runs them."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from plugin_process import PluginProcess
from support.mps import alive, pid_of, write_wrapper

from sharing_plugin.sim.kubelet.simulator import KubeletSimulator

pytestmark = pytest.mark.subprocess

RESOURCE = "nvidia.com/gpu"


@pytest.fixture
def binary(short_dir: Path) -> Iterator[Path]:
    yield write_wrapper(short_dir / "bin")
    for pid_file in short_dir.rglob("nvidia-cuda-mps-control.pid"):
        pid = pid_of(pid_file.parent)
        if pid is not None and alive(pid):
            os.kill(pid, signal.SIGKILL)


async def test_run_then_mps_control_then_its_restart_adopts_the_daemon(
    short_dir: Path, kubelet: KubeletSimulator, binary: Path
) -> None:
    mps_root = short_dir / "mps"
    config = short_dir / "config.yaml"
    config.write_text(
        f"version: v1\nflags:\n  mpsRoot: {mps_root}\nsharing:\n  mps:\n    resources:\n"
        f"    - name: {RESOURCE}\n      replicas: 3\n"
    )
    node = short_dir / "node.yaml"
    node.write_text(yaml.safe_dump({"gpus": [{"product": "NVIDIA A30", "count": 2}]}))
    common = ["--config", str(config), "--gpus", f"simulated:{node}"]
    common += ["--kubelet-dir", str(short_dir)]
    pipe = mps_root / RESOURCE / "pipe"
    async with PluginProcess([*common, "--metrics-address", "off"]) as plugin:
        await kubelet.wait_for(lambda: kubelet.capacity(RESOURCE) == 6, timeout=10)
        assert kubelet.allocatable(RESOURCE) == 0

        async with PluginProcess(
            common, env={"MPS_CONTROL_BIN": str(binary)}, command="mps-control"
        ) as control:
            await kubelet.wait_for(lambda: kubelet.allocatable(RESOURCE) == 6, timeout=15)
            pid = pid_of(pipe)
            assert await control.stop() == 0
        assert pid is not None and alive(pid)  # stopping mps-control spares the clients

        async with PluginProcess(
            [*common, "--mps-control-bin", str(binary)], command="mps-control"
        ) as control:
            adopted = "adopted the running daemon"
            async with asyncio.timeout(15):
                while not any(adopted in x for x in control.stderr_lines):  # noqa: ASYNC110 -- a log line
                    await asyncio.sleep(0.02)
            assert pid_of(pipe) == pid
            assert kubelet.allocatable(RESOURCE) == 6
            assert await control.stop() == 0
        assert await plugin.stop() == 0
