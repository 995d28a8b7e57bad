"""`sharing-plugin demo`: the whole plugin on a simulated node, against the kubelet simulator.

It copies an example config to a temporary file (whose path it prints), runs the real daemon on
the simulated `dgx-a100-80gb` preset with the in-package kubelet simulator, prints what the node
advertises the way `kubectl describe node` shows it, admits one sample pod and prints the
Allocate answer its container got. Then it follows the config file: every edit is hot-reloaded
and the node's new capacity printed, until Ctrl-C (or at once with `--once`).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from sharing_plugin.daemon.app import Daemon
from sharing_plugin.daemon.options import RunOptions, SourceOptions
from sharing_plugin.daemon.outcome import Rejected
from sharing_plugin.sim.kubelet.simulator import KubeletSimulator
from sharing_plugin.sim.nvml.simulated import SimulatedNvml

DEMO_PRESET = "dgx-a100-80gb"
SAMPLE_RESOURCE = "nvidia.com/gpu.shared"

Print = Callable[[str], None]


def _node_view(kubelet: KubeletSimulator) -> list[str]:
    names = sorted(kubelet.resources())
    width = max((len(n) for n in names), default=0) + 2
    lines = ["Capacity:"]
    lines += [f"  {(n + ':').ljust(width)}{kubelet.capacity(n)}" for n in names]
    lines.append("Allocatable:")
    lines += [f"  {(n + ':').ljust(width)}{kubelet.allocatable(n)}" for n in names]
    return lines


def _snapshot(kubelet: KubeletSimulator) -> tuple[tuple[str, int, int], ...]:
    return tuple(
        (n, kubelet.capacity(n), kubelet.allocatable(n)) for n in sorted(kubelet.resources())
    )


def _in_sync(kubelet: KubeletSimulator, daemon: Daemon) -> bool:
    """Kubelet holds exactly the device lists the daemon advertises."""
    plan = daemon.supervisor.advertised
    return (
        plan is not None
        and bool(plan.resources)
        and all(
            kubelet.devices(r.name) == {d.id: d.health.value for d in r.devices}
            for r in plan.resources
        )
    )


def _differs(
    kubelet: KubeletSimulator, seen: tuple[tuple[str, int, int], ...]
) -> Callable[[], bool]:
    return lambda: _snapshot(kubelet) != seen


async def _sample_pod(kubelet: KubeletSimulator, say: Print) -> None:
    pod = await kubelet.admit_pod("demo-pod", containers={"cuda": {SAMPLE_RESOURCE: 1}})
    allocation = pod.get("cuda", SAMPLE_RESOURCE)
    say(f"Pod default/demo-pod, container cuda, {SAMPLE_RESOURCE}: 1")
    say(f"  kubelet picked:  {', '.join(allocation.device_ids)}")
    for key, value in sorted(allocation.response.envs.items()):
        say(f"  env {key}={value}")
    for mount in allocation.response.mounts:
        say(f"  mount {mount.host_path} -> {mount.container_path}")
    for name in allocation.response.cdi_devices:
        say(f"  CDI device {name.name}")
    kubelet.delete_pod("demo-pod")


async def run_demo(*, once: bool, say: Print = print, workdir: Path | None = None) -> int:
    """Run the demo; returns the exit code. `workdir` (default: a new temp dir) holds it all."""
    own_dir = workdir is None
    root = workdir or Path(tempfile.mkdtemp(prefix="sp-demo-", dir="/tmp"))
    try:
        config_path = root / "config.yaml"
        source = resources.files("sharing_plugin.sim").joinpath("demo-config.yaml")
        config_path.write_text(source.read_text(encoding="utf-8"), encoding="utf-8")
        kubelet_dir = root / "kubelet"
        say(f"Simulated node: {DEMO_PRESET} (8 x NVIDIA A100-SXM4-80GB)")
        say(f"Config file:    {config_path}")
        options = RunOptions(
            source=SourceOptions(
                config_path=config_path, gpus=f"simulated:{DEMO_PRESET}", kubelet_dir=kubelet_dir
            )
        )
        async with (
            KubeletSimulator(kubelet_dir) as kubelet,
            Daemon(options, nvml=SimulatedNvml.from_preset(DEMO_PRESET)) as daemon,
        ):
            await kubelet.wait_for(lambda: _in_sync(kubelet, daemon), timeout=10)
            say("")
            for line in _node_view(kubelet):
                say(line)
            say("")
            await _sample_pod(kubelet, say)
            if once:
                return 0
            say("")
            say(f"Edit {config_path} to hot-reload it; Ctrl-C to stop.")
            await _follow(kubelet, daemon, say)
        return 0
    finally:
        if own_dir:
            shutil.rmtree(root, ignore_errors=True)


async def _follow(kubelet: KubeletSimulator, daemon: Daemon, say: Print) -> None:
    shown = _snapshot(kubelet)
    stopped = asyncio.ensure_future(daemon.wait_stopped())
    waits: list[asyncio.Future[Any]] = [stopped]
    outcomes = daemon.pipeline.outcomes()
    try:
        while not stopped.done():
            node = asyncio.ensure_future(kubelet.wait_for(_differs(kubelet, shown), timeout=3600))
            outcome = asyncio.ensure_future(outcomes.next(timeout=3600))
            waits = [stopped, node, outcome]
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            rejected = (
                outcome.done()
                and not outcome.cancelled()
                and isinstance(outcome.result(), Rejected)
            )
            for pending in (node, outcome):
                pending.cancel()
            await asyncio.gather(node, outcome, return_exceptions=True)
            if rejected and daemon.status.last_error:
                say(f"config rejected, the last good one keeps serving: {daemon.status.last_error}")
            if _snapshot(kubelet) != shown:
                shown = _snapshot(kubelet)
                say("")
                for line in _node_view(kubelet):
                    say(line)
    finally:
        outcomes.close()
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
