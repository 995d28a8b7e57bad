"""Capacity never lies, in the moments where it used to (issue 16): a killed run's sockets."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from sharing_plugin.backends import backend_from_spec
from sharing_plugin.daemon.app import Daemon
from sharing_plugin.daemon.options import RunOptions
from sharing_plugin.sim.kubelet.simulator import KubeletSimulator

GPU = "nvidia.com/gpu"


def sliced(replicas: int) -> str:
    return f"""\
version: v1
sharing:
  timeSlicing:
    resources:
      - name: nvidia.com/gpu
        replicas: {replicas}
"""


@asynccontextmanager
async def plugin(root: Path, config: Path) -> AsyncIterator[Daemon]:
    gpus = "simulated:dgx-a100-80gb"
    options = RunOptions(config_path=config, gpus=gpus, kubelet_dir=root, drain_recheck_s=0.05)
    async with Daemon(options, nvml=backend_from_spec(gpus)) as daemon:
        yield daemon


def dead_socket(path: Path) -> None:
    """A socket file nobody listens on, as a killed process leaves it."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(path))


async def test_sockets_left_by_a_killed_run_are_removed_at_start(short_dir: Path) -> None:
    """Defect 6: only ours (by name), only dead ones; kubelet's and other plugins' stay."""
    config = short_dir / "config.yaml"
    config.write_text(sliced(2), encoding="utf-8")
    async with KubeletSimulator(short_dir, grace_period=0.2, dial_timeout=2.0) as kubelet:
        plugin_dir = kubelet.plugin_dir
        stale = [
            plugin_dir / "sharing-nvidia.com-gpu-0123abcd.sock",
            plugin_dir / "sharing-nvidia.com-gpu.shared-89abcdef.sock",
            plugin_dir / "sharing-4567cdef.sock",
        ]
        for path in stale:
            dead_socket(path)
        others = [plugin_dir / "other-vendor.sock", plugin_dir / "sharing-notes-0123abcd.sock.d"]
        dead_socket(others[0])
        others[1].write_text("not a socket")
        not_a_socket = plugin_dir / "sharing-nvidia.com-gpu-aaaabbbb.sock"
        not_a_socket.write_text("a file with our name is not ours to delete")
        # A second instance still serving (a rolling update) keeps its socket.
        live_path = plugin_dir / "sharing-nvidia.com-gpu-fedcba98.sock"
        live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            live.bind(str(live_path))
            live.listen()
            async with plugin(short_dir, config) as daemon:
                await kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 16)
                assert not [p for p in stale if p.exists()]
                assert all(p.exists() for p in [*others, not_a_socket, live_path])
                assert kubelet.registration_socket.exists()
                assert all(p.exists() for p in daemon.supervisor.own_sockets())
        finally:
            live.close()
