"""Benchmark: per-pod GPU usage, what one scrape costs and what it costs while nobody scrapes.

1. scrape: the real device plugin in-process on a simulated node of 8 A100-80GB, each time-sliced 48
   ways (384 replicas), with 48 processes per GPU (384 in all, each of its own pod: a /proc
   tree of their cgroups, the 384 pods in the fake kube-apiserver and admitted by the kubelet
   simulator, so every process is named through the API). One scrape with a fresh reading is
   PodResources, the NVML pass (memory, 384 processes, utilization), the cgroups, attribution
   and rendering /metrics: measured in-process as `refresh(max_age=0)` + `render()`, `--rounds`
   times. Goal: p50 <= 20 ms. Next to it, the same render from a cached reading (what a second
   scrape within a second costs), and a few real HTTP GETs of /metrics a second apart (each a
   fresh reading), so the figure holds end to end.
2. idle: three `run` processes side by side for `--idle-s`, nobody scraping any: (a) the node
   above with its processes and the shared config, no pod holding a replica; (b) the same node
   and config without processes (the baseline: nothing for usage to see, the same 384 devices
   on ListAndWatch, whose grpc threads wake more than a few devices' do); (c) as (a) with 8
   pods holding replicas, the one case that runs the over-share check (every 15 s with the
   default overShareSeconds of 60). The window opens `--settle-s` (16 s) after the start: past
   the one check an applied config that shares devices gets 15 s later. CPU as % of one core
   and wake-ups per second per thread (bench_daemon.py's measure). Goal: (a) within noise of
   (b).

Run from the repository root: `.venv/bin/python bench/bench_usage.py` (`--quick`, `--only
scrape|idle`, `--json PATH` for make bench).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import shutil
import statistics
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "integration"))
sys.path.insert(0, str(ROOT / "tests"))

import yaml_fast  # noqa: E402
from bench_daemon import _wakeups, idle_cpu, short_dir, start_plugin, stop_plugin  # noqa: E402
from figures import FigureLog, add_json_option, ms, p50_p99  # noqa: E402
from kube_api import FakeKubeApi  # noqa: E402
from plugin_process import free_port, http_get  # noqa: E402

from sharing_plugin.backends import backend_from_spec  # noqa: E402
from sharing_plugin.daemon.node.options import SourceOptions  # noqa: E402
from sharing_plugin.daemon.run.app import NodeDevicePlugin  # noqa: E402
from sharing_plugin.daemon.run.options import RunOptions  # noqa: E402
from sharing_plugin.plan.model import physical_of  # noqa: E402
from sharing_plugin.sim.kubelet.simulator import KubeletSimulator  # noqa: E402
from sharing_plugin.sources.kube import client_from_kubeconfig  # noqa: E402

GPU = "nvidia.com/gpu"
GPUS, PER_GPU = 8, 48
NODE = "bench-node"
SHARED = (
    "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
    f"    - name: nvidia.com/gpu\n      replicas: {PER_GPU}\n"
)


def node_file(path: Path, processes: list[dict[str, object]]) -> Path:
    description = {
        "name": "usage-bench",
        "gpus": [{"product": "NVIDIA A100-SXM4-80GB", "count": GPUS}],
        "processes": processes,
    }
    path.write_text(yaml_fast.dump(description))
    return path


def in_pod(uid: str, container_id: str) -> str:
    return (
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
        f"{uid.replace('-', '_')}.slice/cri-containerd-{container_id}.scope\n"
    )


# --- 1. one scrape ---------------------------------------------------------------------------


async def bench_scrape(rounds: int, http_rounds: int, log: FigureLog) -> None:
    work = short_dir("bu")
    rng = random.Random(25)
    proc = work / "proc"
    proc.mkdir()
    node = node_file(work / "node.yaml", [])
    config = work / "config.yaml"
    config.write_text(SHARED)
    port = free_port()
    try:
        async with FakeKubeApi() as api:
            api.put_node(NODE)
            client = client_from_kubeconfig(api.kubeconfig(work / "kubeconfig"))
            options = RunOptions(
                SourceOptions(
                    config_path=config,
                    gpus=f"simulated:{node}",
                    kubelet_dir=work,
                    node_name=NODE,
                ),
                proc_root=proc,
                metrics_address=("127.0.0.1", port),
            )
            nvml = backend_from_spec(options.source.gpus)
            try:
                async with (
                    KubeletSimulator(work) as kubelet,
                    NodeDevicePlugin(options, nvml=nvml, kube_client=client) as daemon,
                ):
                    await kubelet.wait_for(
                        lambda: kubelet.capacity(GPU) == GPUS * PER_GPU, timeout=20
                    )
                    index = {g.uuid: g.index for g in nvml.gpus}  # type: ignore[attr-defined]
                    processes: list[dict[str, object]] = []
                    for n in range(GPUS * PER_GPU):
                        name = f"pod-{n:03d}"
                        container = f"{n:064x}"
                        pod = api.put_pod(
                            "bench",
                            name,
                            node=NODE,
                            containers={"main": f"containerd://{container}"},
                        )
                        held = await kubelet.admit_pod(name, "bench", containers={"main": {GPU: 1}})
                        (device,) = held.device_ids("main", GPU)
                        pid = 10_000 + n
                        (proc / str(pid)).mkdir()
                        (proc / str(pid) / "cgroup").write_text(
                            in_pod(pod["metadata"]["uid"], container)
                        )
                        processes.append(
                            {
                                "gpu": index[physical_of(device)],
                                "pid": pid,
                                "memory": rng.randrange(256, 1700) << 20,
                                "sm": rng.choice([0, 5, 20, 60]),
                            }
                        )
                    node_file(node, processes)
                    usage = daemon.usage
                    started = time.perf_counter()
                    await usage.refresh(max_age=0)
                    cold = time.perf_counter() - started
                    view = usage.view
                    assert view is not None
                    named = sum(1 for c in view.report.containers() if c.attributed and c.pids)
                    assert named == GPUS * PER_GPU, f"only {named} processes named"
                    fresh, renders = [], []
                    for _ in range(rounds):
                        started = time.perf_counter()
                        await usage.refresh(max_age=0)
                        body = daemon.metrics.render()
                        fresh.append(time.perf_counter() - started)
                        started = time.perf_counter()
                        daemon.metrics.render()
                        renders.append(time.perf_counter() - started)
                    over_http = []
                    for _ in range(http_rounds):
                        await asyncio.sleep(1.05)  # past the shared reading: a fresh one
                        started = time.perf_counter()
                        code, _, _ = await http_get(port, "/metrics")
                        over_http.append(time.perf_counter() - started)
                        assert code == 200
            finally:
                await client.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    series = sum(1 for line in body.splitlines() if line.startswith(b"sharing_plugin_pod_gpu_"))
    p50, p99 = p50_p99(fresh)
    print(f"first reading (384 cgroups read, pods listed): {ms(cold)}")
    print(f"one scrape, fresh reading + render: p50 {ms(p50)}, p99 {ms(p99)} (n={len(fresh)})")
    r50, r99 = p50_p99(renders)
    print(f"render from the shared reading:     p50 {ms(r50)}, p99 {ms(r99)}; {series} pod series")
    if over_http:
        median = ms(statistics.median(over_http))
        print(f"GET /metrics over HTTP, fresh:       median {median} (n={len(over_http)})")
    log.add(
        f"one scrape, {GPUS} GPUs x {PER_GPU} processes (fresh reading: PodResources, NVML, "
        "cgroups, attribution, /metrics render)",
        "p50 <= 20 ms",
        f"p50 {ms(p50)}, p99 {ms(p99)} (n={len(fresh)}; first reading {ms(cold)}; "
        + (
            f"over HTTP median {ms(statistics.median(over_http))}, n={len(over_http)})"
            if over_http
            else "no HTTP rounds)"
        ),
        f"render from a reading shared within the second: p50 {ms(r50)}",
    )


# --- 2. nobody scrapes -----------------------------------------------------------------------


async def bench_idle(idle_s: float, settle_s: float, log: FigureLog) -> None:
    work = short_dir("bv")
    processes = [
        {"gpu": g, "pid": 10_000 + g * PER_GPU + j, "memory": "1Gi", "sm": 10}
        for g in range(GPUS)
        for j in range(PER_GPU)
    ]
    shared = work / "shared.yaml"
    shared.write_text(SHARED)
    plugins = []
    try:
        cases = {}
        for name, processes_of, config, devices in (
            ("a", processes, shared, GPUS * PER_GPU),
            ("b", [], shared, GPUS * PER_GPU),
            ("c", processes, shared, GPUS * PER_GPU),
        ):
            (work / name).mkdir()
            node = node_file(work / f"node-{name}.yaml", processes_of)
            args = [
                "--config",
                str(config),
                "--gpus",
                f"simulated:{node}",
                "--proc-root",
                str(work / name),
            ]
            plugin, kubelet, _ = await start_plugin(work / name, args, {GPU: devices})
            plugins.append((plugin, kubelet))
            cases[name] = (plugin, kubelet)
        kubelet_c = cases["c"][1]
        for n in range(GPUS):  # pods holding replicas: the over-share check has work
            await kubelet_c.admit_pod(f"p{n}", "bench", containers={"main": {GPU: 1}})
        # Past start-up, and past the one check a config that shares devices gets a quarter of
        # overShareSeconds after it is applied (a PodResources List; NVML only if replicas are
        # held): what is left is what a node runs for as long as nothing changes.
        await asyncio.sleep(settle_s)
        (a, b, c) = await asyncio.gather(
            *(idle_cpu(cases[k][0].pid, idle_s) for k in ("a", "b", "c"))
        )
    finally:
        for plugin, kubelet in plugins:
            await stop_plugin(plugin, kubelet)
        shutil.rmtree(work, ignore_errors=True)
    for label, (cpu, ticks, lines) in (
        ("(a) processes, shared, no pod holding a replica", a),
        ("(b) baseline: the same node and config, no processes", b),
        ("(c) 8 pods holding shared replicas (over-share check)", c),
    ):
        print(f"idle {idle_s:g} s {label}: {cpu:.3f}% of a core (utime+stime {ticks:.2f}%)")
        print("\n".join(lines))
    log.add(
        f"idle CPU of `run`, {idle_s:g} s, nobody scraping: 8 GPUs x 48 processes, shared, "
        "no replica held",
        "unchanged: within noise of the baseline",
        f"{a[0]:.3f} % ({_wakeups(a[2])})",
        f"same node and config, no processes: {b[0]:.3f} % ({_wakeups(b[2])})",
    )
    log.add(
        f"idle CPU of `run`, {idle_s:g} s, nobody scraping, 8 pods holding shared replicas "
        "(over-share check every 15 s)",
        "-",
        f"{c[0]:.3f} % ({_wakeups(c[2])})",
        f"baseline above: {b[0]:.3f} %",
    )


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer rounds, 5 s idle")
    parser.add_argument("--only", choices=("scrape", "idle"))
    parser.add_argument("--rounds", type=int, default=100, help="fresh scrapes in-process")
    parser.add_argument("--http-rounds", type=int, default=5, help="HTTP scrapes, 1 s apart")
    parser.add_argument("--idle-s", type=float, default=30.0, help="the idle window")
    parser.add_argument(
        "--settle-s", type=float, default=16.0, help="wait after start before the idle window"
    )
    add_json_option(parser)
    args = parser.parse_args()
    rounds, http_rounds, idle_s, settle_s = (
        (20, 2, 5.0, 1.0)
        if args.quick
        else (args.rounds, args.http_rounds, args.idle_s, args.settle_s)
    )
    log = FigureLog(args.json)
    logging.basicConfig(level=logging.ERROR)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{os.cpu_count()} CPUs, load average {load}, Python {sys.version.split()[0]}")
    parts: dict[str, Callable[[], Awaitable[None]]] = {
        "scrape": lambda: bench_scrape(rounds, http_rounds, log),
        "idle": lambda: bench_idle(idle_s, settle_s, log),
    }
    failed = 0
    for name, part in parts.items():
        if args.only not in (None, name):
            continue
        try:
            await part()
        except Exception as exc:
            failed += 1
            traceback.print_exc()
            last = (str(exc).strip().splitlines() or [""])[-1][:160]
            log.add(f"bench_usage.py, part {name}", "", f"failed: {type(exc).__name__}: {last}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
