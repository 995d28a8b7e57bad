"""The NVIDIA driver loads after the plugin: every serving command finds the GPUs once NVML
answers, seen from outside the processes (the node description says `driverLoaded: false`,
then the test edits it to true, as a driver container finishing its install would).

`run` and `mps-control` are checked together, as a pod runs them: `run` must advertise the
GPUs (capacity), and `mps-control` must start their MPS daemon, without which `run` keeps
every MPS device Unhealthy (allocatable). `run-dra` is checked against the fake API server in
its own test module.
"""

from __future__ import annotations

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


def driver_loaded(node: Path, loaded: bool) -> None:
    """Rewrite the node description with `driverLoaded`, in one rename (as an editor saves)."""
    data = yaml.safe_load(node.read_text())
    data["driverLoaded"] = loaded
    tmp = node.with_name(node.name + ".tmp")
    tmp.write_text(yaml.safe_dump(data))
    tmp.replace(node)


async def test_run_and_mps_control_serve_the_gpus_once_the_driver_answers(
    short_dir: Path, kubelet: KubeletSimulator, binary: Path
) -> None:
    mps_root = short_dir / "mps"
    config = short_dir / "config.yaml"
    config.write_text(
        f"version: v1\nflags:\n  mpsRoot: {mps_root}\n  failOnInitError: false\n"
        f"sharing:\n  mps:\n    resources:\n    - name: {RESOURCE}\n      replicas: 3\n"
    )
    node = short_dir / "node.yaml"
    node.write_text(yaml.safe_dump({"gpus": [{"product": "NVIDIA A30", "count": 2}]}))
    driver_loaded(node, False)
    common = ["--config", str(config), "--gpus", f"simulated:{node}"]
    common += ["--kubelet-dir", str(short_dir)]
    async with (
        PluginProcess([*common, "--metrics-address", "off"]) as plugin,
        PluginProcess(
            common, env={"MPS_CONTROL_BIN": str(binary)}, command="mps-control"
        ) as control,
    ):
        # Both are up and waiting for the driver (each logged NVML's refusal).
        for process in (plugin, control):
            await process.wait_for_line("NVML_ERROR_DRIVER_NOT_LOADED", timeout=10)
        assert kubelet.capacity(RESOURCE) == 0

        driver_loaded(node, True)
        await kubelet.wait_for(lambda: kubelet.capacity(RESOURCE) == 6, timeout=10)
        await kubelet.wait_for(lambda: kubelet.allocatable(RESOURCE) == 6, timeout=10)
        for process in (control, plugin):
            assert await process.stop() == 0
