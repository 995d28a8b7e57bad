"""Benchmark: `run-dra` for 8 shared GPUs, against the real Kubernetes 1.36 DRA allocator.

`../shared/tools/realdra136.gz` (the scheduler's structured allocator with consumable capacity,
and the kubelet's DRA manager, over an in-memory API server; its README there). Each round
starts a fresh realdra136 and a `sharing-plugin run-dra` process for a simulated DGX A100 whose
8 GPUs are time-sliced 4 ways and so published by capacity (8 devices, 32 shares), then asks
the real allocator for a claim every 10 ms until one is allocated. Measured:

1. start -> allocatable: from just before the plugin is spawned to the first allocation.
2. publish -> allocatable: from the first time the API holds the whole pool (asked every 10 ms)
   to the first allocation: what the allocator and our slices add after the publish.
3. allocate, pool of 8 shared GPUs: the real allocator's time for each of 32 claims that ask
   nothing (all fit), then a 33rd (refused: no share left), p50 and p99.

Run from the repository root: `.venv/bin/python bench/bench_dra.py` (`--rounds N`, `--json PATH`
for `make bench`). Without the tools the figures say they were not measured.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import realdra  # noqa: E402
from figures import FigureLog, add_json_option, ms, p50_p99  # noqa: E402
from plugin_process import PluginProcess  # noqa: E402

from sharing_plugin.views.dra_api import device_class  # noqa: E402

NODE = "node-1"
CONFIG = (
    "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n"
    "      - name: gpu\n        replicas: 4\n"
)
RESOURCE = "nvidia.com/gpu.shared"
CLASS = "gpu.shared.gpu.sharing-plugin.io"
DEVICES, SHARES = 8, 32


async def claim(real: realdra.RealDra, name: str) -> None:
    await real.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": CLASS}}]}
            },
        }
    )


async def allocate(real: realdra.RealDra, name: str) -> bool:
    answer = await real.cmd({"cmd": "allocate", "claim": {"namespace": "default", "name": name}})
    return bool(answer.get("ok"))


async def one_round(work: Path) -> tuple[float, float]:
    """(start -> allocatable, publish -> allocatable) in seconds."""
    async with realdra.running("realdra136", work, node=NODE) as real:
        await real.create(device_class(RESOURCE, realdra.DRIVER))
        await claim(real, "first")
        config = work / "config.yaml"
        config.write_text(CONFIG)
        args = ["--config", str(config), "--gpus", "simulated:dgx-a100-80gb"]
        args += ["--kubelet-dir", str(work), "--node-name", NODE, "--cdi-dir", str(work / "cdi")]
        args += ["--metrics-address", "off", "--log-level", "warning"]
        plugin = PluginProcess(args, {"KUBECONFIG": real.kubeconfig}, command="run-dra")
        started = time.perf_counter()
        async with plugin:
            published: float | None = None
            async with asyncio.timeout(30):
                while True:
                    if published is None:
                        slices = await real.slices()
                        if sum(len(s["spec"].get("devices") or ()) for s in slices) == DEVICES:
                            published = time.perf_counter()
                    if published is not None and await allocate(real, "first"):
                        done = time.perf_counter()
                        break
                    await asyncio.sleep(0.01)
            await plugin.stop()
        return done - started, done - published


async def allocations(work: Path) -> tuple[list[float], float, bool]:
    """The allocator's time per claim over a pool of 8 GPUs x 4 shares, and for one too many."""
    async with realdra.running("realdra136", work, node=NODE) as real:
        await real.create(device_class(RESOURCE, realdra.DRIVER))
        config = work / "config.yaml"
        config.write_text(CONFIG)
        args = ["--config", str(config), "--gpus", "simulated:dgx-a100-80gb"]
        args += ["--kubelet-dir", str(work), "--node-name", NODE, "--cdi-dir", str(work / "cdi")]
        args += ["--metrics-address", "off", "--log-level", "warning"]
        async with PluginProcess(args, {"KUBECONFIG": real.kubeconfig}, command="run-dra") as p:
            await real.wait_slices(DEVICES, within=30)
            times: list[float] = []
            for i in range(SHARES + 1):
                await claim(real, f"c{i}")
                before = time.perf_counter()
                ok = await allocate(real, f"c{i}")
                elapsed = time.perf_counter() - before
                if i < SHARES:
                    assert ok, f"claim {i} of {SHARES} was refused"
                    times.append(elapsed)
                else:
                    refused, refused_s = not ok, elapsed
            await p.stop()
        return times, refused_s, refused


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    add_json_option(parser)
    args = parser.parse_args()
    log = FigureLog(args.json)
    names = (
        "DRA, 8 shared GPUs by capacity: run-dra start -> a claim allocated (real 1.36 allocator)",
        "DRA, 8 shared GPUs by capacity: pool published -> a claim allocated (real 1.36 allocator)",
        "DRA, 8 shared GPUs x 4 shares: one allocation by the real 1.36 allocator",
    )
    if not realdra.available("realdra136"):
        for name in names:
            log.add(name, "-", f"not measured: {realdra.skip_reason('realdra136')}")
        print(realdra.skip_reason("realdra136"))
        return 0
    base = Path(tempfile.mkdtemp(prefix="bdra", dir="/tmp"))
    try:
        starts: list[float] = []
        publishes: list[float] = []
        for i in range(args.rounds):
            work = base / f"r{i}"
            work.mkdir()
            start_s, publish_s = asyncio.run(one_round(work))
            starts.append(start_s)
            publishes.append(publish_s)
        work = base / "alloc"
        work.mkdir()
        times, refused_s, refused = asyncio.run(allocations(work))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    for name, samples in ((names[0], starts), (names[1], publishes)):
        log.add(
            name, "-", f"p50 {ms(p50_p99(samples)[0])}, max {ms(max(samples))} (n={len(samples)})"
        )
    p50, p99 = p50_p99(times)
    outcome = "refused" if refused else "ALLOCATED (a share given twice)"
    log.add(
        names[2],
        "-",
        f"p50 {ms(p50)}, p99 {ms(p99)} (n={len(times)}); the 33rd claim {outcome} in "
        f"{ms(refused_s)}",
    )
    for figure in log.figures:
        print(f"{figure.figure}: {figure.value}")
    return 0 if refused else 1


if __name__ == "__main__":
    sys.exit(main())
