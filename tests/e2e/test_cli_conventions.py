"""Command-line conventions on the real command line: `--version`, `run --log-level` /
`LOG_LEVEL` (with `METRICS_ADDRESS=off` and a SIGINT stop), and `run` refusing a kubelet dir
whose socket paths cannot exist (exit 1 at start, not retries forever; checked in this process,
as it never serves)."""

from __future__ import annotations

import signal
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from cli_capture import cli
from plugin_process import PluginProcess, child_env

from sharing_plugin.sim.kubelet.simulator import KubeletSimulator

GPU = "nvidia.com/gpu"
START_S = 10.0


@pytest.mark.subprocess
def test_version_flag() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sharing_plugin", "--version"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env=child_env(),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"sharing-plugin {version('gpu-sharing-plugin')}\n"


@pytest.mark.subprocess
async def test_log_level_from_env_and_flag(kubelet: KubeletSimulator, short_dir: Path) -> None:
    base = ["--gpus", "simulated:t4x4", "--kubelet-dir", str(short_dir)]
    env = {"METRICS_ADDRESS": "off", "LOG_LEVEL": "warning"}
    async with PluginProcess(base, env) as quiet:
        await kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 4, timeout=START_S)
        assert await quiet.stop(signal.SIGTERM, timeout=2.0) == 0
    assert not [line for line in quiet.stderr_lines if " INFO " in line], quiet.stderr()
    # The flag wins over the env var, as for every other flag; SIGINT stops it as SIGTERM does.
    async with PluginProcess([*base, "--log-level", "debug"], env) as chatty:
        await kubelet.wait_for(lambda: len(kubelet.registrations) == 2, timeout=START_S)
        assert await chatty.stop(signal.SIGINT, timeout=2.0) == 0
    assert [line for line in chatty.stderr_lines if " DEBUG " in line], chatty.stderr()
    assert [line for line in chatty.stderr_lines if " INFO " in line], chatty.stderr()
    assert "listening" not in chatty.stderr(), "METRICS_ADDRESS=off still listened"
    assert list(kubelet.plugin_dir.glob("sharing-*.sock")) == []


def test_kubelet_dir_too_long_for_socket_paths_exits_1(short_dir: Path) -> None:
    kubelet_dir = short_dir / ("k" * 100)
    args = ["--gpus", "simulated:t4x4", "--kubelet-dir", str(kubelet_dir)]
    done = cli("run", *args, "--metrics-address", "off")
    assert done.returncode == 1
    text = done.stderr
    assert f"socket path {kubelet_dir}/device-plugins/sharing-xxxxxxxx.sock" in text
    assert "over the 107-byte limit of a unix socket path" in text
    assert "Traceback" not in text
    assert not kubelet_dir.exists()
