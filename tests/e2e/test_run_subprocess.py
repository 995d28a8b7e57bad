"""`sharing-plugin run` as a real process: flags, kubelet registration, the metrics address, a
hot reload from a file edit, JSON logs, SIGTERM, and usage errors (exit 2; those in this
process, through the command line's `main`). `run` configured by env vars alone is in
test_contracts.py; `METRICS_ADDRESS=off` and SIGINT in test_cli_conventions.py."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from plugin_process import PluginProcess, free_port, http_get

from sharing_plugin.cli import main
from sharing_plugin.sim.kubelet.simulator import KubeletSimulator

GPU = "nvidia.com/gpu"
# dgx-a100-80gb: 8 whole GPUs.
GPUS = 8
CONFIG = """\
version: v1
sharing:
  timeSlicing:
    resources:
      - name: nvidia.com/gpu
        replicas: {}
"""
START_S = 10.0  # generous for a loaded CI machine; the benchmark measures the real time


def write_config(path: Path, replicas: int) -> None:
    """Replace the file as an editor saving it would (write aside, rename over)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(CONFIG.format(replicas), encoding="utf-8")
    tmp.replace(path)


def own_sockets(kubelet: KubeletSimulator) -> list[str]:
    return sorted(p.name for p in kubelet.plugin_dir.glob("sharing-*.sock"))


@pytest.mark.subprocess
async def test_run_registers_serves_reloads_and_stops(
    kubelet: KubeletSimulator, short_dir: Path
) -> None:
    config = short_dir / "config.yaml"
    write_config(config, 4)
    port = free_port()
    args = [
        "--config", str(config),
        "--gpus", "simulated:dgx-a100-80gb",
        "--kubelet-dir", str(short_dir),
        "--metrics-address", f"127.0.0.1:{port}",
        "--log-format", "json",
    ]  # fmt: skip
    async with PluginProcess(args) as plugin:
        await kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 4 * GPUS, timeout=START_S)
        assert [r.resource for r in kubelet.registrations] == [GPU]
        assert len(own_sockets(kubelet)) == 1

        status, _, body = await http_get(port, "/readyz")
        assert status == 200, body
        status, headers, body = await http_get(port, "/status")
        assert status == 200
        assert headers["content-type"].startswith("application/json")
        document = json.loads(body)
        assert document["config"]["generation"] == 1
        assert document["lastError"] is None
        assert document["resources"][GPU]["devices"] == 4 * GPUS
        assert document["resources"][GPU]["healthy"] == 4 * GPUS
        status, _, body = await http_get(port, "/metrics")
        assert status == 200
        assert f'sharing_plugin_devices{{resource="{GPU}"}} 32.0' in body.decode()

        write_config(config, 2)
        await kubelet.wait_for(lambda: kubelet.capacity(GPU) == 2 * GPUS, timeout=5)
        # A changed device set is a new ListAndWatch message, not a new registration.
        assert len(kubelet.registrations) == 1
        _, _, body = await http_get(port, "/status")
        assert json.loads(body)["config"]["generation"] == 2

        assert await plugin.stop(signal.SIGTERM, timeout=2.0) == 0
    assert own_sockets(kubelet) == []
    entries = [json.loads(line) for line in plugin.stderr_lines]
    assert entries, "no log lines"
    assert all({"ts", "level", "logger", "msg"} <= entry.keys() for entry in entries)
    assert any("generation 2" in entry["msg"] for entry in entries)


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (["--log-format", "xml"], {}, "--log-format must be text or json"),
        ([], {"LOG_FORMAT": "yaml"}, "--log-format must be text or json"),
        (["--metrics-address", "nowhere"], {}, "metrics address 'nowhere'"),
        ([], {"METRICS_ADDRESS": "127.0.0.1:99999"}, "metrics address"),
        (["--no-such-flag"], {}, "unrecognized arguments"),
    ],
)
def test_run_usage_error_exits_2(
    args: list[str],
    env: dict[str, str],
    expected: str,
    short_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # In this process (the command line's `main`, env vars set here): these fail before
    # anything starts; the exit code through a real process is checked by the tests above.
    base = {"KUBELET_DIR": str(short_dir), "GPUS": "simulated:dgx-a100-80gb"}
    for name, value in {**base, **env}.items():
        monkeypatch.setenv(name, value)
    assert main(["run", *args]) == 2
    assert expected in capsys.readouterr().err
    assert not (short_dir / "device-plugins").exists()
