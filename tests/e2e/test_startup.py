"""`run --gpus nvml` on a node whose NVML cannot be loaded: failOnInitError decides, as in the
reference plugin. These run the real pynvml; on a machine with an NVIDIA driver they are skipped."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pynvml
import pytest
from cli_capture import cli
from plugin_process import PluginProcess

from sharing_plugin.sim.kubelet.simulator import KubeletSimulator


def _nvml_loads() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


pytestmark = pytest.mark.skipif(_nvml_loads(), reason="NVML works here: nothing fails to start")


def test_fail_on_init_error_stops_the_plugin_with_the_reason(short_dir: Path) -> None:
    args = ["--gpus", "nvml", "--kubelet-dir", str(short_dir), "--metrics-address", "off"]
    done = cli("run", *args)  # it stops before serving: no child process needed
    assert done.returncode == 1
    text = done.stderr
    assert "cannot run: initialising NVML: NVML_ERROR_" in text
    assert "failOnInitError is true" in text
    assert "Traceback" not in text


@pytest.mark.subprocess
async def test_without_fail_on_init_error_it_serves_no_gpus(
    short_dir: Path, kubelet: KubeletSimulator
) -> None:
    config = short_dir / "c.yaml"
    config.write_text("version: v1\nflags:\n  failOnInitError: false\n")
    args = ["--config", str(config), "--gpus", "nvml", "--kubelet-dir", str(short_dir)]
    async with PluginProcess([*args, "--metrics-address", "off"]) as plugin:
        async with asyncio.timeout(10):
            while not any("applied (start" in line for line in plugin.stderr_lines):  # noqa: ASYNC110
                await asyncio.sleep(0.05)  # the log is the only sign; it has no event
        assert kubelet.resources() == []
        assert await plugin.stop() == 0
    assert "no GPUs are advertised" in plugin.stderr()
    assert "cannot watch NVML events" not in plugin.stderr()
