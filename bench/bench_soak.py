"""Soak: the issue-16 storm for thousands of reloads, against the real `sharing-plugin run` process.

The plugin runs as a child process (`python -m sharing_plugin run --config F --gpus
simulated:dgx-a100-80gb`) against the in-package kubelet simulator in this process. For
`--reloads` reloads (or `--max-s` seconds, whichever ends first):

- the config file is replaced (write aside, rename over) with the next of a cycle of configs:
  `nvidia.com/gpu` time-sliced 2, 3, 4 or 5 ways, every tenth one renamed to
  `nvidia.com/gpu.shared` (a resource stopped, another started and registered); each reload is
  timed from the rename to the simulator holding the new list (allocatable = 8 x replicas);
- pods are admitted at `--pods-per-s` (default 130/s, one device of the current resource each)
  and the oldest deleted beyond `--live-pods`, so admissions race every reload;
- kubelet restarts every `--kubelet-restart-every` reloads (the plugin re-registers).

Reported: RSS growth per 100 reloads after `--warmup` reloads (least-squares slope of VmRSS
sampled every 100 reloads; goal: <= 50 KiB per 100 reloads, issue 24), VmHWM, failed
admissions (the plugin refused an Allocate or a device was granted twice; goal 0) next to
admissions that found no free device or no registered resource (kubelet's own answers while a
resource is renamed or kubelet restarts), Allocate round trip p50/p99 during the storm (timed by
the simulator as kubelet would), and reload latency p50/p99.

With `--tracemalloc` the plugin runs under tracemalloc (`traced_run.py`, about three times
slower) and, at each RSS sample, reports the Python heap it traces too: the part of the growth
that is Python objects (held by our code) rather than memory the C libraries keep.

Run from the repository root (bounded: at most `--max-s`, default 280 s, plus start and stop):

    .venv/bin/python bench/bench_soak.py                # 3,000 reloads
    .venv/bin/python bench/bench_soak.py --quick        # 600 reloads, about a minute
    .venv/bin/python bench/bench_soak.py --reloads 1500 --warmup 300 --tracemalloc
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from figures import FigureLog, add_json_option, p50_p99  # noqa: E402
from plugin_process import PluginProcess  # noqa: E402

from sharing_plugin.sim.kubelet.simulator import AdmissionError, KubeletSimulator  # noqa: E402

GPUS = 8
GPU = "nvidia.com/gpu"
SHARED = "nvidia.com/gpu.shared"
RELOAD_TIMEOUT_S = 10.0
RSS_EVERY = 100  # reloads between RSS samples


def config_text(replicas: int, rename: bool) -> str:
    return (
        "version: v1\nsharing:\n  timeSlicing:\n"
        f"    renameByDefault: {'true' if rename else 'false'}\n"
        f"    resources:\n      - name: nvidia.com/gpu\n        replicas: {replicas}\n"
    )


def write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def vm_kib(pid: int, field_name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field_name}:"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field_name} for {pid}")


def slope_per_1000(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of (reloads, MiB) points, in MiB per 1,000 reloads."""
    xs = [x for x, _ in points]
    ys = [y for _, y in points]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mean_x) ** 2 for x in xs)
    if var == 0:
        return 0.0
    cov = sum((x - mean_x) * (y - mean_y) for x, y in points)
    return cov / var * 1000


class TracedPlugin(PluginProcess):
    """The plugin under tracemalloc (`traced_run.py`); `traced_kib()` asks it for its heap."""

    def __init__(self, args: list[str], out: Path) -> None:
        super().__init__(args)
        self.args = [sys.executable, str(ROOT / "bench" / "traced_run.py"), str(out), *args]
        self.out = out

    async def traced_kib(self) -> float:
        before = self.out.stat().st_mtime_ns if self.out.exists() else 0
        os.kill(self.pid, signal.SIGUSR1)
        async with asyncio.timeout(30):
            while not self.out.exists() or self.out.stat().st_mtime_ns == before:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        return int(self.out.read_text()) / 1024


@dataclass
class Storm:
    kubelet: KubeletSimulator
    resource: str = GPU
    admitted: int = 0
    no_capacity: int = 0
    not_registered: int = 0
    cut_off: int = 0
    failed: list[str] = field(default_factory=list)
    live: list[str] = field(default_factory=list)
    counter: int = 0

    async def admissions(self, per_s: float, live_pods: int, stop: asyncio.Event) -> None:
        period = 1 / per_s
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while not stop.is_set():
            self.counter += 1
            name = f"p{self.counter}"
            try:
                await self.kubelet.admit_pod(name, containers={"c": {self.resource: 1}})
            except AdmissionError as exc:
                message = str(exc)
                if "requested number of devices unavailable" in message:
                    self.no_capacity += 1
                elif "unregistered device" in message or "has been stopped" in message:
                    self.not_registered += 1
                elif "client connection is closing" in message:
                    self.cut_off += 1
                else:
                    self.failed.append(message)
            else:
                self.admitted += 1
                self.live.append(name)
            while len(self.live) > live_pods:
                self.kubelet.delete_pod(self.live.pop(0))
            next_at = max(next_at + period, loop.time())
            await asyncio.sleep(max(0.0, next_at - loop.time()))

    def granted_twice(self) -> list[str]:
        seen: dict[tuple[str, str], int] = {}
        for pod in self.kubelet.pods.values():
            for a in pod.allocations:
                for device_id in a.device_ids:
                    seen[(a.resource, device_id)] = seen.get((a.resource, device_id), 0) + 1
        return [f"{r} {i}" for (r, i), n in seen.items() if n > 1]


async def soak(args: argparse.Namespace, figures: FigureLog) -> int:
    with tempfile.TemporaryDirectory(prefix="s", dir="/tmp") as tmp:
        root = Path(tmp)
        config = root / "config.yaml"
        write(config, config_text(2, False))
        plugin_args = [
            "--config", str(config),
            "--gpus", "simulated:dgx-a100-80gb",
            "--kubelet-dir", str(root),
            "--metrics-address", "off",
            "--log-level", "warning",
        ]  # fmt: skip
        process = (
            TracedPlugin(plugin_args, root / "traced")
            if args.tracemalloc
            else PluginProcess(plugin_args)
        )
        async with (
            KubeletSimulator(root, grace_period=1.0, dial_timeout=5.0) as kubelet,
            process as plugin,
        ):
            await kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 2 * GPUS, timeout=60)
            traced = plugin if isinstance(plugin, TracedPlugin) else None
            code = await run_storm(args, figures, kubelet, plugin.pid, config, traced)
            plugin_code = await plugin.stop(timeout=5)
            errors = [line for line in plugin.stderr_lines if "Traceback" in line]
            print(f"plugin exit code {plugin_code}; tracebacks in its log: {len(errors)}")
            return code or plugin_code or (1 if errors else 0)


async def run_storm(
    args: argparse.Namespace,
    figures: FigureLog,
    kubelet: KubeletSimulator,
    pid: int,
    config: Path,
    traced: TracedPlugin | None = None,
) -> int:
    rng = random.Random(args.seed)
    loop = asyncio.get_running_loop()
    storm = Storm(kubelet)
    stop = asyncio.Event()
    admitting = asyncio.create_task(storm.admissions(args.pods_per_s, args.live_pods, stop))
    rss: list[tuple[int, float]] = [(0, vm_kib(pid, "VmRSS") / 1024)]
    heap: list[tuple[int, float]] = []  # (reloads, traced Python heap in MiB)
    latencies: list[float] = []
    slow = 0
    restarts = 0
    started = loop.time()
    current = (2, False)
    reloads = 0
    allocations_before = len(kubelet.allocate_seconds)
    try:
        while reloads < args.reloads and loop.time() - started < args.max_s:
            replicas, rename = current
            while (replicas, rename) == current:
                replicas = rng.choice((2, 3, 4, 5))
                rename = (reloads + 1) % 10 == 0
            current = (replicas, rename)
            name = SHARED if rename else GPU
            t0 = time.perf_counter()
            write(config, config_text(replicas, rename))
            storm.resource = name  # pods ask for the resource as soon as the admin renamed it
            try:
                await kubelet.wait_for(
                    lambda: kubelet.allocatable(name) == replicas * GPUS,  # noqa: B023 -- awaited here
                    timeout=RELOAD_TIMEOUT_S,
                )
            except TimeoutError:
                slow += 1
            latencies.append(time.perf_counter() - t0)
            reloads += 1
            if args.kubelet_restart_every and reloads % args.kubelet_restart_every == 0:
                await kubelet.restart()
                restarts += 1
                try:
                    await kubelet.wait_for(
                        lambda: kubelet.allocatable(name) == replicas * GPUS,  # noqa: B023 -- awaited here
                        timeout=RELOAD_TIMEOUT_S,
                    )
                except TimeoutError:
                    slow += 1
            if reloads % RSS_EVERY == 0:
                rss.append((reloads, vm_kib(pid, "VmRSS") / 1024))
                traced_text = ""
                if traced is not None:
                    heap.append((reloads, await traced.traced_kib() / 1024))
                    traced_text = f" (Python heap {heap[-1][1] * 1024:,.1f} KiB)"
                elapsed = loop.time() - started
                print(
                    f"{reloads:5d} reloads, {elapsed:6.1f} s: RSS {rss[-1][1]:.1f} MiB"
                    f"{traced_text}, {storm.admitted} admitted, {len(storm.failed)} failed",
                    flush=True,
                )
    finally:
        stop.set()
        await admitting
    elapsed = loop.time() - started
    twice = storm.granted_twice()
    allocate = list(kubelet.allocate_seconds)[allocations_before:]
    after_warmup = [(n, mib) for n, mib in rss if n >= args.warmup]
    growth = slope_per_1000(after_warmup) if len(after_warmup) >= 2 else float("nan")
    peak = vm_kib(pid, "VmHWM") / 1024
    reload_p50, reload_p99 = p50_p99(latencies)
    alloc_p50, alloc_p99 = p50_p99(allocate) if allocate else (float("nan"),) * 2

    print(f"\n{reloads} reloads in {elapsed:.1f} s ({reloads / elapsed:.1f}/s), {restarts} kubelet")
    print(f"restarts; {slow} reloads not seen within {RELOAD_TIMEOUT_S:g} s")
    print(
        f"RSS: {rss[0][1]:.1f} MiB at start, {rss[-1][1]:.1f} MiB at the end, peak {peak:.1f} "
        f"MiB; growth after {args.warmup} reloads: {growth * 1024 / 10:+.1f} KiB per 100 reloads"
    )
    heap_after = [(n, mib) for n, mib in heap if n >= args.warmup]
    if len(heap_after) >= 2:
        heap_growth = slope_per_1000(heap_after) * 1024 / 10
        print(f"Python heap (tracemalloc): {heap_growth:+.2f} KiB per 100 reloads after warm-up")
    print(
        f"admissions: {storm.admitted} admitted, {len(storm.failed)} failed, "
        f"{storm.no_capacity} found no free device, {storm.not_registered} found the resource "
        f"unregistered (rename or kubelet restart), {storm.cut_off} lost kubelet's connection "
        f"mid-call (re-registration); devices granted twice: {len(twice)}"
    )
    for message in storm.failed[:5]:
        print(f"  failed: {message}")
    print(
        f"Allocate round trip during the storm ({len(allocate)} calls): "
        f"p50 {alloc_p50 * 1000:.2f} ms, p99 {alloc_p99 * 1000:.2f} ms"
    )
    print(f"reload (rename -> kubelet holds the list): p50 {reload_p50 * 1000:.1f} ms, "
          f"p99 {reload_p99 * 1000:.1f} ms")  # fmt: skip

    figures.add(
        f"soak: RSS growth after {args.warmup:,} reloads (renames, 130 admissions/s, kubelet "
        "restarts)",
        "<= 50 KiB per 100 reloads (issue 24)",
        f"{growth * 1024 / 10:+.1f} KiB per 100 reloads ({reloads:,} reloads, "
        f"{rss[0][1]:.1f} -> {rss[-1][1]:.1f} MiB)",
    )
    figures.add("soak: peak RSS (VmHWM)", "<= 256 MiB limit", f"{peak:.1f} MiB")
    figures.add("soak: failed admissions", "0", str(len(storm.failed) + len(twice)))
    figures.add("soak: Allocate p99 during the storm", "", f"{alloc_p99 * 1000:.2f} ms")
    figures.add("soak: reload p99 during the storm", "<= 400 ms", f"{reload_p99 * 1000:.1f} ms")
    return 1 if storm.failed or twice else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reloads", type=int, default=3000)
    parser.add_argument("--max-s", type=float, default=280.0, help="stop the storm after this")
    parser.add_argument("--warmup", type=int, default=500, help="reloads before RSS is judged")
    parser.add_argument("--pods-per-s", type=float, default=130.0)
    parser.add_argument("--live-pods", type=int, default=12)
    parser.add_argument("--kubelet-restart-every", type=int, default=150)
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--quick", action="store_true", help="600 reloads, warm-up 200")
    parser.add_argument(
        "--tracemalloc", action="store_true", help="also report the plugin's traced Python heap"
    )
    add_json_option(parser)
    args = parser.parse_args()
    # The simulator logs every stream a rename ends; the report says what counts.
    logging.basicConfig(level=logging.ERROR)
    if args.quick:
        args.reloads, args.warmup = 600, 200
    return asyncio.run(soak(args, FigureLog(args.json)))


if __name__ == "__main__":
    sys.exit(main())
