"""Bad input from the node's side gets one precise line and changes nothing.

The cases an admin meets by hand: a ConfigMap volume whose `..data` points nowhere, a config
path that is an empty directory or turns into one, an unreadable file, no Kubernetes
credentials, a kubelet directory that does not exist yet, and broken node descriptions or
kubeconfig files. Each must be one line (no traceback), and a bad config must leave the last good
one serving.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from cli_capture import cli
from daemon_harness import Running, eventually, run_options, running
from k8s_fake import ConfigMapVolume
from support.observe import next_applied

from sharing_plugin.backends import backend_from_spec
from sharing_plugin.config.loader import parse_configs
from sharing_plugin.daemon.node.outcome import Rejected
from sharing_plugin.daemon.run.app import NodeDevicePlugin
from sharing_plugin.errors import ConfigError, KubeApiError
from sharing_plugin.sim.kubelet.simulator import KubeletSimulator
from sharing_plugin.sources.kube import client_from_environment

GPU = "nvidia.com/gpu"
SLICED = (
    "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
    "      - name: nvidia.com/gpu\n        replicas: 2\n"
)


def _one_line(message: str) -> str:
    assert "\n" not in message and "Traceback" not in message, message
    return message


async def _rejected(run: Running, change: object) -> str:
    """Apply `change()` (an edit of the config) and return the daemon's lastError."""
    before = {r: run.kubelet.devices(r) for r in run.kubelet.resources()}
    plan = run.daemon.supervisor.advertised
    with run.daemon.pipeline.outcomes() as outcomes:
        change()  # type: ignore[operator]
        rejected = await outcomes.next()
    assert isinstance(rejected, Rejected)
    error = run.daemon.status.to_json()["lastError"]
    assert error == "; ".join(rejected.lines())
    assert error is not None
    assert run.daemon.supervisor.advertised is plan
    assert {r: run.kubelet.devices(r) for r in run.kubelet.resources()} == before
    return _one_line(error)


# -- the config path -------------------------------------------------------------------------


async def test_configmap_whose_data_link_points_nowhere_names_the_dangling_keys(
    short_dir: Path,
) -> None:
    volume = ConfigMapVolume(short_dir / "cm", {"default": SLICED})
    async with running(short_dir, None, config_path=volume.root) as run:
        assert run.capacity() == {GPU: 16}

        def dangle() -> None:
            os.symlink("..gone", volume.root / "..data_tmp")
            os.rename(volume.root / "..data_tmp", volume.root / "..data")

        error = await _rejected(run, dangle)
        assert error.startswith(f"{volume.root}:1:1: the directory holds no config")
        assert "default link to files that do not exist" in error


async def test_config_file_replaced_by_an_empty_directory_keeps_the_last_good_config(
    short_dir: Path,
) -> None:
    async with running(short_dir, SLICED) as run:

        def to_directory() -> None:
            run.config.unlink()
            run.config.mkdir()

        error = await _rejected(run, to_directory)
        assert error == f"{run.config}:1:1: the directory holds no config (one file per name)"
        run.config.rmdir()
        run.write(SLICED.replace("replicas: 2", "replicas: 3"))
        await run.kubelet.wait_for(lambda: run.kubelet.capacity(GPU) == 24, timeout=5)


async def test_empty_config_directory_at_start_serves_nothing_until_fixed(short_dir: Path) -> None:
    config = short_dir / "cm"
    config.mkdir()
    async with running(short_dir, None, config_path=config, wait_ready=False) as run:
        error = run.daemon.status.to_json()["lastError"]
        assert (
            _one_line(error) == f"{config}:1:1: the directory holds no config (one file per name)"
        )
        assert run.daemon.supervisor.advertised is None
        with run.daemon.pipeline.outcomes() as outcomes:
            (config / "default").write_text(SLICED)
            await next_applied(outcomes)
        await run.kubelet.wait_for(lambda: run.kubelet.capacity(GPU) == 16, timeout=5)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
async def test_unreadable_config_file_says_permission_denied(short_dir: Path) -> None:
    async with running(short_dir, SLICED) as run:
        error = await _rejected(run, lambda: run.config.chmod(0))
        assert error == f"{run.config}:1:1: cannot read: Permission denied"


async def test_config_path_under_a_file_says_why_it_cannot_be_read(short_dir: Path) -> None:
    (short_dir / "file").write_text("")
    config = short_dir / "file" / "config.yaml"
    async with running(short_dir, None, config_path=config, wait_ready=False) as run:
        error = run.daemon.status.to_json()["lastError"]
        assert _one_line(error) == f"{config}:1:1: cannot read: Not a directory"


# -- YAML that once escaped as an exception or a multi-line message ---------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # PyYAML refuses the character while building its reader, before any parsing.
        (b"version: v1\nflags: x\x00y\n", "f:2:9: character U+0000 is not allowed in YAML"),
        (b'version: v1\n"\\ud800": 1\n', "f:2:1: escape for U+D800 is half of a UTF-16"),
        (b'version: v1\n"a\\nb": 1\n', "f:2:1: ['a\\nb']: unknown field 'a\\nb'"),
    ],
)
def test_yaml_oddities_are_one_located_line(text: bytes, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_configs(text, file="f")
    assert _one_line(str(caught.value)).startswith(expected)


# -- the rest of the node ----------------------------------------------------------------------


async def test_node_name_without_credentials_serves_without_the_label(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "KUBECONFIG"):
        monkeypatch.delenv(name, raising=False)
    async with running(short_dir, SLICED, node_name="gpu-node-1") as run:
        assert run.capacity() == {GPU: 16}
        assert run.daemon.status.to_json()["lastError"] is None


async def test_kubelet_dir_that_does_not_exist_yet_registers_once_kubelet_comes(
    short_dir: Path,
) -> None:
    kubelet_dir = short_dir / "k"
    options = run_options(gpus="simulated:t4x4", kubelet_dir=kubelet_dir, drain_recheck_s=0.05)
    async with NodeDevicePlugin(options, nvml=backend_from_spec(options.source.gpus)) as daemon:
        assert daemon.status.to_json()["lastError"] is None
        async with KubeletSimulator(kubelet_dir, grace_period=0.2, dial_timeout=2.0) as kubelet:
            await kubelet.wait_for(lambda: kubelet.capacity(GPU) == 4, timeout=5)
        await eventually(lambda: daemon.supervisor.advertised is not None)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"gpus:\n  - product: [unclosed\n", ":3:1: not valid YAML: while parsing a flow sequence"),
        (b"\xff\xfe", ": not UTF-8 (byte 0xff at offset 0)"),
        (None, ": cannot read node description: [Errno 2] No such file or directory"),
    ],
)
def test_broken_node_description_is_one_line(
    short_dir: Path, content: bytes | None, expected: str
) -> None:
    path = short_dir / "node.yaml"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ConfigError) as caught:
        backend_from_spec(f"simulated:{path}")
    assert _one_line(str(caught.value)).startswith(f"{path}{expected}")


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"apiVersion: v1\nclusters: [\n", "cannot read: while parsing a flow node"),
        (b"\xff\n", "cannot read: 'utf-8' codec can't decode byte 0xff"),
    ],
)
def test_broken_kubeconfig_is_one_line(short_dir: Path, content: bytes, expected: str) -> None:
    path = short_dir / "kubeconfig"
    path.write_bytes(content)
    with pytest.raises(KubeApiError) as caught:
        client_from_environment({"KUBECONFIG": str(path)}, service_account_dir=short_dir)
    assert _one_line(str(caught.value)).startswith(f"kubeconfig {path}: {expected}")


def test_run_with_a_broken_node_description_exits_1_with_one_line(short_dir: Path) -> None:
    node = short_dir / "node.yaml"
    node.write_bytes(b"\xff\xfe")
    args = ["--gpus", f"simulated:{node}", "--kubelet-dir", str(short_dir / "k")]
    done = cli("run", *args, "--metrics-address", "off")
    assert done.returncode == 1, done.stderr
    [line] = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert line.endswith(
        f"cannot run: {node}: not UTF-8 (byte 0xff at offset 0); save the node description as UTF-8"
    ), line
    shutil.rmtree(short_dir / "k", ignore_errors=True)
