"""`demo`: the whole plugin on a simulated node, against the in-package kubelet simulator.

It copies an example config to a temporary file (whose path it prints), runs the real daemon on
the simulated `dgx-a100-80gb` preset with the kubelet simulator, prints what the node advertises
the way `kubectl describe node` shows it, admits one sample pod and prints the Allocate answer
its container got. Then it follows the config file: every edit is hot-reloaded and the node's
new capacity printed, until Ctrl-C (or at once with `--once`).

An entry command rather than a simulator: it wires the daemon to the simulators as `run` wires
it to kubelet, so the simulators stay below the daemon. The daemon and the simulators are
imported when the command runs, as every command here does.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sharing_plugin.cli.common import EXIT_OK

if TYPE_CHECKING:
    from sharing_plugin.daemon.run.app import NodeDevicePlugin
    from sharing_plugin.sim.kubelet.simulator import KubeletSimulator

DEMO_PRESET = "dgx-a100-80gb"
SAMPLE_RESOURCE = "nvidia.com/gpu.shared"

Print = Callable[[str], None]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = sub.add_parser("demo", help="the plugin on a simulated node with a simulated kubelet")
    demo.add_argument("--once", action="store_true", help="print, admit one pod, and exit")
    demo.set_defaults(func=_cmd_demo)


def _cmd_demo(args: argparse.Namespace) -> int:
    import asyncio
    import signal

    from sharing_plugin.daemon.node.logs import configure as configure_logging

    configure_logging("text", level=logging.WARNING)
    # The simulated kubelet warns, as kubelet does, when our stream ends at shutdown: expected.
    logging.getLogger("sharing_plugin.sim.kubelet.endpoint").setLevel(logging.ERROR)
    # The demo prints rejected configs itself.
    logging.getLogger("sharing_plugin.daemon.node.report").setLevel(logging.CRITICAL)

    async def demo() -> int:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        loop.add_signal_handler(signal.SIGINT, task.cancel)
        loop.add_signal_handler(signal.SIGTERM, task.cancel)
        return await run_demo(once=args.once, say=lambda line: print(line, flush=True))

    try:
        return asyncio.run(demo())
    except asyncio.CancelledError:
        print("stopped.")
        return EXIT_OK


async def run_demo(*, once: bool, say: Print = print, workdir: Path | None = None) -> int:
    """Run the demo; returns the exit code. `workdir` (default: a new temp dir) holds it all."""
    import shutil
    import tempfile
    from importlib import resources

    from sharing_plugin.daemon.node.options import SourceOptions
    from sharing_plugin.daemon.run.app import NodeDevicePlugin
    from sharing_plugin.daemon.run.options import RunOptions
    from sharing_plugin.sim.kubelet.simulator import KubeletSimulator
    from sharing_plugin.sim.nvml.simulated import SimulatedNvml

    own_dir = workdir is None
    root = workdir or Path(tempfile.mkdtemp(prefix="sp-demo-", dir="/tmp"))
    try:
        config_path = root / "config.yaml"
        source = resources.files("sharing_plugin.cli").joinpath("demo-config.yaml")
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
            NodeDevicePlugin(options, nvml=SimulatedNvml.from_preset(DEMO_PRESET)) as daemon,
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


def _in_sync(kubelet: KubeletSimulator, daemon: NodeDevicePlugin) -> bool:
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


async def _follow(kubelet: KubeletSimulator, daemon: NodeDevicePlugin, say: Print) -> None:
    import asyncio

    from sharing_plugin.daemon.node.outcome import Rejected

    shown = _snapshot(kubelet)
    stopped = asyncio.ensure_future(daemon.wait_stopped())
    waits: list[asyncio.Future[Any]] = [stopped]
    with daemon.pipeline.outcomes() as outcomes:
        try:
            while not stopped.done():
                changed = _differs(kubelet, shown)
                node = asyncio.ensure_future(kubelet.wait_for(changed, timeout=3600))
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
                error = daemon.status.last_error
                if rejected and error:
                    say(f"config rejected, the last good one keeps serving: {error}")
                if _snapshot(kubelet) != shown:
                    shown = _snapshot(kubelet)
                    say("")
                    for line in _node_view(kubelet):
                        say(line)
        finally:
            for wait in waits:
                wait.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
