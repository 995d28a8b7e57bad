"""What an admin feels on a real one-node Kubernetes 1.36 cluster (`../shared/tools/realcluster.gz`:
scheduler, controllers, a real kubelet; tests/realcluster.py starts a private one).

- A ConfigMap edit (server-side apply, as `kubectl apply --server-side` sends it) that raises
  replicas by one, with a pod Pending for want of one: apply -> the plugin has applied it (its
  log line; in `run` the kubelet's ListAndWatch stream gets the list then) -> the Node's
  allocatable (device plugin) or the node's ResourceSlices (DRA) show it -> the Pending pod
  Running. In device-plugin mode (`run`) and in DRA mode (`run-dra`, `sharedDevices: replicas`:
  one device per replica, so a raise adds a device the scheduler can give at once).
- A pod with a claim from a ResourceClaimTemplate, from its creation to Running: a shared GPU by
  capacity (four T4s, four shares each) and a dynamic MIG 1g.10gb (an A100 partitioned per
  claim).

    .venv/bin/python bench/bench_cluster.py                 # 30 edits per mode, 20 claims
    .venv/bin/python bench/bench_cluster.py --edits 3 --claims 5 --json /tmp/c.json
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import realcluster  # noqa: E402
import yaml  # noqa: E402
from figures import FigureLog, add_json_option, ms, p50_p99  # noqa: E402
from lightkube.resources.core_v1 import Pod  # noqa: E402
from plugin_process import PluginProcess  # noqa: E402
from realcluster_state import slices_when  # noqa: E402
from realcluster_support import (  # noqa: E402
    DEPLOY_DRA,
    DRIVER,
    GPU,
    OnNode,
    on_node,
    sliced,
    unschedulable,
)

L4 = "simulated:workstation"  # one GPU
T4X4 = "simulated:t4x4"
A100_DYNAMIC = {"gpus": [{"product": "NVIDIA A100-SXM4-80GB", "mig": {"enabled": True}}]}
NODE_STATUS_S = 10.0  # the kubelet's nodeStatusUpdateFrequency
DYNAMIC = "version: v1\npartitioning:\n  mig:\n    - devices: all\n      dynamic: true\n"


def dra_sliced(replicas: int, shared: str) -> str:
    return sliced(replicas) + f"dra:\n  sharedDevices: {shared}\n"


def applied_at(plugin: PluginProcess, generation: int) -> float | None:
    """When (time.time()) the plugin's log says it applied config generation `generation`."""
    for line in plugin.stderr_lines:
        if "applied (" in line and f"generation {generation})" in line:
            stamp = line.split()[0].replace("Z", "+00:00")
            return datetime.fromisoformat(stamp).timestamp()
    return None


async def edits(
    node: OnNode, plugin: PluginProcess, rounds: int, *, dra: bool
) -> list[tuple[float, ...]]:
    """`rounds` raises of replicas by one, each with one pod Pending for want of it:
    (apply -> plugin applied, -> Node/slices show it, -> Pending pod Running) per raise."""
    namespace = await node.namespace()
    template = None
    if dra:
        template = "one"
        await node.claim_template(namespace, template, f"gpu.{DRIVER}")
    config = (lambda r: dra_sliced(r, "replicas")) if dra else sliced
    limits = {} if dra else {GPU: 1}
    await node.pod(namespace, "p1", limits, template=template)
    await node.running(namespace, "p1", within=60)
    taken: list[tuple[float, ...]] = []
    for replicas in range(2, rounds + 2):
        name = f"p{replicas}"
        await node.pod(namespace, name, limits, template=template)
        await node.pod_when(namespace, name, lambda p: unschedulable(p) is not None)
        if not dra:  # an edit lands anywhere in the kubelet's node-status period
            await asyncio.sleep(random.uniform(0, NODE_STATUS_S))
        start = time.time()
        await node.configure(config(replicas))
        if dra:
            await slices_when(node, has_devices(replicas), within=60)
        else:
            await node.allocatable(allocatable_is(replicas), within=60)
        shown = time.time()
        await node.running(namespace, name, within=60)
        running = time.time()
        applied = applied_at(plugin, replicas)  # generation 1 was replicas 1
        assert applied is not None, plugin.stderr()[-2000:]
        taken.append((applied - start, shown - start, running - start))
    return taken


def has_devices(count: int) -> Callable[[dict[str, Any]], bool]:
    return lambda slices: devices(slices) == count


def allocatable_is(count: int) -> Callable[[dict[str, str]], bool]:
    return lambda allocatable: allocatable.get(GPU) == str(count)


def devices(slices: dict[str, Any]) -> int:
    return sum(len(s["spec"].get("devices") or ()) for s in slices.values())


async def claims_to_running(node: OnNode, rounds: int, device_class: str) -> list[float]:
    namespace = await node.namespace()
    await node.claim_template(namespace, "one", device_class)
    taken = []
    for n in range(rounds):
        start = time.time()
        await node.pod(namespace, f"c{n}", {}, template="one")
        await node.running(namespace, f"c{n}", within=60)
        taken.append(time.time() - start)
        await node.client.delete(Pod, f"c{n}", namespace=namespace)
    return taken


async def measure(
    cluster: realcluster.RealCluster, args: argparse.Namespace, log: FigureLog
) -> None:
    def report(name: str, samples: list[float]) -> None:
        p50, p99 = p50_p99(samples)
        log.add(
            name, "-", f"p50 {ms(p50)}, p99 {ms(p99)}, max {ms(max(samples))} (n={len(samples)})"
        )

    def legs(mode: str, shown: str, taken: list[tuple[float, ...]]) -> None:
        for i, leg in enumerate(("the plugin applied it", shown, "a Pending pod Running")):
            report(f"real cluster, {mode}: ConfigMap apply -> {leg}", [t[i] for t in taken])

    with tempfile.TemporaryDirectory(prefix="bc", dir="/tmp") as work:
        base = Path(work)
        (base / "dp").mkdir()
        async with on_node(cluster, base / "dp") as node:
            await node.configure(sliced(1))
            async with node.plugin(L4) as plugin:
                await node.allocatable(lambda a: a.get(GPU) == "1", within=60)
                legs(
                    "device plugin (run)",
                    "the Node's allocatable",
                    await edits(node, plugin, args.edits, dra=False),
                )
        (base / "dra").mkdir()
        async with on_node(cluster, base / "dra", DEPLOY_DRA) as node:
            await node.configure(dra_sliced(1, "replicas"))
            async with node.plugin(L4, command="run-dra", CLEAR_SLICES_ON_EXIT="on") as plugin:
                await slices_when(node, bool)
                legs(
                    "DRA (run-dra, replicas)",
                    "the node's ResourceSlices",
                    await edits(node, plugin, args.edits, dra=True),
                )
            await node.configure(dra_sliced(4, "capacity"))
            async with node.plugin(T4X4, command="run-dra", CLEAR_SLICES_ON_EXIT="on"):
                await slices_when(node, bool)
                report(
                    "real cluster, DRA: pod with a claim created -> Running, shared T4 by capacity",
                    await claims_to_running(node, args.claims, f"gpu.{DRIVER}"),
                )
            await slices_when(node, lambda s: not s, within=60)
            gpus = base / "a100.yaml"
            gpus.write_text(yaml.safe_dump(A100_DYNAMIC))
            await node.configure(DYNAMIC)
            async with node.plugin(
                f"simulated:{gpus}", command="run-dra", CLEAR_SLICES_ON_EXIT="on"
            ):
                await slices_when(node, bool)
                report(
                    "real cluster, DRA: pod with a claim created -> Running, "
                    "dynamic MIG 1g.10gb (instance made)",
                    await claims_to_running(node, args.claims, f"mig-1g.10gb.{DRIVER}"),
                )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edits", type=int, default=30, help="ConfigMap edits per mode")
    parser.add_argument("--claims", type=int, default=20, help="claim pods per device kind")
    add_json_option(parser)
    args = parser.parse_args()
    log = FigureLog(args.json)
    if not realcluster.AVAILABLE:
        log.add("real cluster figures", "-", f"not measured: {realcluster.SKIP_REASON}")
        print(realcluster.SKIP_REASON)
        return 0
    with realcluster.private() as cluster:
        asyncio.run(measure(cluster, args, log))
    for figure in log.figures:
        print(f"{figure.figure}: {figure.value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
