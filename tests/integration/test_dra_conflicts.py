"""run-dra refuses to start on a node where a device plugin serves its resource names: our `run`
serving in the same kubelet directory (its live sockets), or any device plugin the Node's
allocatable shows; a killed `run`'s sockets, and names the kubelet reports at zero, are none."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from daemon_harness import running
from dra_harness import NODE, dra_running
from kube_api import FakeKubeApi
from support.observe import recording_backend

from sharing_plugin.errors import StartupError

CONFIG = "version: v1\n"
GPUS = "simulated:t4x4"
A100 = "simulated:dgx-a100-80gb"  # MIG off: a declared layout would turn it on


async def test_refused_while_run_serves_on_the_node_and_started_once_it_stopped(
    short_dir: Path,
) -> None:
    async with running(short_dir, CONFIG, gpus=GPUS) as plugin:
        sockets = sorted(p.name for p in (short_dir / "device-plugins").glob("sharing-*.sock"))
        assert sockets
        with pytest.raises(StartupError) as refused:
            async with dra_running(short_dir, CONFIG, gpus=GPUS, wait_registered=False):
                pass
        message = str(refused.value)
        assert "the device plugin (sharing-plugin run) serves on this node" in message
        assert all(name in message for name in sockets)
        assert "never both" in message
        assert plugin.allocatable() == {"nvidia.com/gpu": 4}  # run keeps serving
    # run stopped (its sockets gone): run-dra starts.
    async with dra_running(short_dir, CONFIG, gpus=GPUS) as run:
        await run.published(4)


async def test_refused_before_its_first_config_touches_mig(short_dir: Path) -> None:
    layout = (
        "version: v1\nflags:\n  migStrategy: mixed\npartitioning:\n  mig:\n"
        "    - devices: [0]\n      profiles: {3g.40gb: 2}\n"
    )
    nvml = recording_backend(A100)
    async with running(short_dir, CONFIG, gpus=A100):
        with pytest.raises(StartupError, match="serves on this node"):
            async with dra_running(short_dir, layout, nvml=nvml, wait_registered=False):
                pass
    # run's GPU 0 is as it was: MIG mode left off, no instance made.
    assert nvml.mig_calls == []


async def test_a_killed_runs_sockets_are_no_conflict(short_dir: Path) -> None:
    plugins = short_dir / "device-plugins"
    plugins.mkdir()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as left:
        left.bind(str(plugins / "sharing-nvidia.com-gpu-0123abcd.sock"))  # bound, not listening
    async with dra_running(short_dir, CONFIG, gpus=GPUS) as run:
        await run.published(4)


async def test_refused_while_the_node_lists_one_of_its_names_allocatable(short_dir: Path) -> None:
    async with FakeKubeApi() as api:
        api.put_node(NODE)
        api.set_node_allocatable(NODE, {"cpu": "8", "nvidia.com/gpu": "4"})
        with pytest.raises(StartupError, match=r"node-a has nvidia.com/gpu: 4 allocatable"):
            async with dra_running(short_dir, CONFIG, gpus=GPUS, api=api, wait_registered=False):
                pass
        # The device plugin gone, the kubelet reports the name at zero: no conflict.
        api.set_node_allocatable(NODE, {"cpu": "8", "nvidia.com/gpu": "0"})
        async with dra_running(short_dir, CONFIG, gpus=GPUS, api=api) as run:
            await run.published(4)
