"""The real kube-scheduler's throughput on our ResourceSlice shapes (issue 32, deliverable 6).

A private real one-node Kubernetes 1.36 cluster (`../shared/tools/realcluster.gz`, started by
tests/realcluster.py) is given N more Node objects (no kubelet: the scheduler binds pods to them,
they never run) and, for each, the ResourceSlices `run-dra` would publish for an 8-GPU node,
written by our views code (`views.dra.dra_documents`: config -> plan -> slices) with deploy/dra's
DeviceClasses. Then pods, each with one claim asking one device (from a ResourceClaimTemplate,
as scheduler_perf's SchedulingWithResourceClaimTemplate does, or `--claims direct`: claims made
before the clock starts, so the controller-manager's claim-from-template work is out of the
path): a warm-up batch, then the measured batch, all created at once; pods placed (bound) per
second from the first create to the last bind, seen through a watch. Next to it, the
scheduler's own metrics over the measured batch: its mean algorithm time per pod (PreFilter to
Score, one pod at a time: 1 / it is what the scheduler's CPU work alone allows; binding, rate
limited by its client's QPS, is not in it), and the DynamicResources plugin's Filter per node.

Shapes (8 x H100 80GB, the dgx-h100 preset): `capacity` (time-slicing 8 replicas, published as
8 shared devices, one share per claim), `replicas` (the same, one device per replica: 64),
`mig` (dynamic MIG: 200 placements, 25 per GPU, counters; claims ask a 1g.10gb; `--counter-pods`
of them, these place slowly). To compare, for the same GPUs: `mig-static` (a fixed layout of
seven 1g.10gb per GPU, `partitioning.mig[].profiles`: 56 plain devices, no counters) and
`mig-1g` (not a product shape: the dynamic slices with only the 1g.10gb placements kept).

Kubelet-less nodes: the node-lifecycle controller taints them (not-ready / unreachable); the
bench pods tolerate every taint (`operator: Exists`) rather than faking node heartbeats.

    .venv/bin/python bench/bench_scheduler.py --nodes 100 --pods 300          # quick
    .venv/bin/python bench/bench_scheduler.py --nodes 100,500 --pods 1000 --json /tmp/s.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import realcluster  # noqa: E402
import yaml  # noqa: E402
from figures import FigureLog, add_json_option, ms, p50_p99  # noqa: E402
from kustomize_render import render  # noqa: E402
from realcluster_support import DEPLOY_DRA, DRIVER  # noqa: E402
from sched_cluster import Api, Binds, claim_spec, fake_node, gathered, pod, scheduler_metrics  # noqa: E402

from sharing_plugin.backends import backend_from_spec  # noqa: E402
from sharing_plugin.config.loader import parse_config  # noqa: E402
from sharing_plugin.nvml.discover import discover  # noqa: E402
from sharing_plugin.plan.node import plan_node  # noqa: E402
from sharing_plugin.views.dra import dra_documents  # noqa: E402

PRESET = ROOT / "sharing_plugin" / "sim" / "nvml" / "presets" / "dgx-h100.yaml"
SHARED = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n" + (
    "      - name: nvidia.com/gpu\n        replicas: {replicas}\ndra:\n  sharedDevices: {shared}\n"
)
DYNAMIC = "version: v1\npartitioning:\n  mig:\n    - devices: all\n      dynamic: true\n"
STATIC = (
    "version: v1\nflags:\n  migStrategy: mixed\npartitioning:\n  mig:\n    - devices: all\n"
    "      profiles:\n        1g.10gb: 7\n"
)
GPU_CLASS = f"gpu.{DRIVER}"
MIG_CLASS = f"mig-1g.10gb.{DRIVER}"
RESOURCE_V1 = "/apis/resource.k8s.io/v1"


@dataclass(frozen=True)
class Shape:
    name: str
    config: str
    mig: bool  # the preset's GPUs with MIG mode on
    device_class: str
    keep: Callable[[dict[str, Any]], bool] = lambda device: True  # devices published


def shapes(replicas: int) -> dict[str, Shape]:
    return {
        s.name: s
        for s in (
            Shape(
                "capacity", SHARED.format(replicas=replicas, shared="capacity"), False, GPU_CLASS
            ),
            Shape(
                "replicas", SHARED.format(replicas=replicas, shared="replicas"), False, GPU_CLASS
            ),
            Shape("mig", DYNAMIC, True, MIG_CLASS),
            Shape("mig-static", STATIC, True, MIG_CLASS),
            Shape(
                "mig-1g",
                DYNAMIC,
                True,
                MIG_CLASS,
                keep=lambda d: d["attributes"]["resource"]["string"] == "nvidia.com/mig-1g.10gb",
            ),
        )
    }


def node_documents(shape: Shape, work: Path) -> Callable[[str], list[dict[str, Any]]]:
    """The ResourceSlices `run-dra` publishes for an 8 x H100 node named as given."""
    gpus = yaml.safe_load(PRESET.read_text())
    if shape.mig:
        for entry in gpus["gpus"]:
            entry["mig"] = {"enabled": True}
    spec = work / f"{shape.name}-gpus.yaml"
    spec.write_text(yaml.safe_dump(gpus))
    config = parse_config(shape.config, file="config.yaml").config
    node_plan = plan_node(config, discover(backend_from_spec(f"simulated:{spec}")))

    def documents(node: str) -> list[dict[str, Any]]:
        docs = dra_documents(config, node_plan, node, DRIVER)
        slices = [d for d in docs if d["kind"] == "ResourceSlice"]
        for s in slices:
            if "devices" in s["spec"]:
                s["spec"]["devices"] = [d for d in s["spec"]["devices"] if shape.keep(d)]
        kept = [s for s in slices if s["spec"].get("devices") != []]
        for s in kept:  # a pool the scheduler trusts: all its slices there
            s["spec"]["pool"]["resourceSliceCount"] = len(kept)
        return kept

    return documents


@dataclass(frozen=True)
class Result:
    shape: str
    nodes: int
    pods: int
    bound: int  # of `pods` (fewer: the batch ran out of --timeout)
    slices: int
    devices: int  # per node
    setup_s: float
    created_s: float  # first create -> last create answered
    bound_s: float  # first create -> last bind seen (or -> the --timeout)
    latency: tuple[float, float]  # create answered -> bound, p50 / p99
    algorithm_s: float  # the scheduler's mean algorithm time per pod over the batch
    filter_s: float  # DynamicResources Filter, mean per node evaluated
    load: tuple[float, ...]

    @property
    def rate(self) -> float:
        return self.bound / self.bound_s


async def measure(
    cluster: realcluster.RealCluster, shape: Shape, nodes: int, args: argparse.Namespace
) -> Result:
    ready = json.loads((cluster.home / "ready.json").read_text())
    api = Api(cluster, ready["token"])
    began = time.perf_counter()
    deployed = [d for d in render(DEPLOY_DRA) if d["kind"] == "DeviceClass"]
    await gathered(api.create(f"{RESOURCE_V1}/deviceclasses", d) for d in deployed)
    with tempfile.TemporaryDirectory(prefix="bs") as work:
        documents = node_documents(shape, Path(work))
    names = [f"bench-{i:04d}" for i in range(nodes)]
    per_node = documents(names[0])
    await gathered(api.create("/api/v1/nodes", fake_node(n)) for n in names)
    slices = [s for n in names for s in documents(n)]
    await gathered(api.create(f"{RESOURCE_V1}/resourceslices", s) for s in slices)
    namespace = "bench"
    await api.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
    while True:  # pods need the namespace's default ServiceAccount
        answer = await api.http.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/default")
        if answer.status_code == 200:
            break
        await asyncio.sleep(0.2)
    base = f"/api/v1/namespaces/{namespace}/pods"
    claims = f"{RESOURCE_V1}/namespaces/{namespace}/resourceclaims"
    template = {"metadata": {"name": "one"}, "spec": {"spec": claim_spec(shape.device_class)}}
    await api.create(f"{RESOURCE_V1}/namespaces/{namespace}/resourceclaimtemplates", template)
    binds = Binds()
    watch = asyncio.create_task(binds.follow(api, namespace))
    await asyncio.sleep(0.5)

    async def batch(prefix: str, count: int) -> tuple[float, float, dict[str, float]]:
        """(seconds to create, seconds to the last bind or to the timeout, creates answered)."""
        pods = [f"{prefix}{i}" for i in range(count)]
        if args.claims == "direct":
            await gathered(
                api.create(
                    claims, {"metadata": {"name": p}, "spec": claim_spec(shape.device_class)}
                )
                for p in pods
            )
        answered: dict[str, float] = {}

        async def create(name: str) -> None:
            body = pod(name, template="one") if args.claims == "template" else pod(name, claim=name)
            await api.create(base, body)
            answered[name] = time.perf_counter()

        start = time.perf_counter()
        await gathered((create(p) for p in pods), width=args.width)
        created = time.perf_counter() - start
        done = await binds.all_of(set(pods), within=args.timeout)
        end = max(binds.at[p] for p in pods) if done else time.perf_counter()
        return created, end - start, answered

    heavy = any("consumesCounters" in d for s in per_node for d in s["spec"].get("devices", ()))
    count = args.counter_pods if heavy else args.pods
    await batch("w", min(args.warmup, count))
    setup = time.perf_counter() - began
    metrics_before = await scheduler_metrics(api, ready["scheduler_port"])
    created, bound_s, answered = await batch("p", count)
    metrics_after = await scheduler_metrics(api, ready["scheduler_port"])
    load = os.getloadavg()
    watch.cancel()
    await api.http.aclose()
    bound = {p: binds.at[p] for p in answered if p in binds.at}
    delta = {k: metrics_after.get(k, 0.0) - metrics_before.get(k, 0.0) for k in metrics_after}
    return Result(
        shape=shape.name,
        nodes=nodes,
        pods=count,
        bound=len(bound),
        slices=len(per_node),
        devices=sum(len(s["spec"].get("devices") or ()) for s in per_node),
        setup_s=setup,
        created_s=created,
        bound_s=bound_s,
        latency=p50_p99([bound[p] - answered[p] for p in bound] or [float("nan")]),
        algorithm_s=delta.get("algorithm_sum", 0.0) / max(delta.get("algorithm_count", 0.0), 1.0),
        filter_s=(
            delta["filter_sum"] / delta["filter_count"]
            if delta.get("filter_count")
            else float("nan")  # no Filter sampled (the scheduler samples a share of cycles)
        ),
        load=load,
    )


def report(result: Result, args: argparse.Namespace, log: FigureLog) -> None:
    r = result
    bound = f"{r.pods}" if r.bound == r.pods else f"{r.bound} of {r.pods} (--timeout)"
    filtered = "not sampled" if math.isnan(r.filter_s) else f"{ms(r.filter_s)} per node"
    claims = "claims from a template" if args.claims == "template" else "claims made beforehand"
    name = (
        f"scheduler throughput, {r.nodes} nodes x 8 H100, {r.shape} "
        f"({r.slices} slice(s), {r.devices} devices per node), {claims}"
    )
    value = (
        f"{r.rate:.2f} pods/s ({bound} pods bound in {r.bound_s:.1f} s; created in "
        f"{r.created_s:.1f} s; create -> bound p50 {ms(r.latency[0])}, p99 {ms(r.latency[1])}); "
        f"scheduler: mean algorithm {ms(r.algorithm_s)} per pod "
        f"(1 / it: {1 / max(r.algorithm_s, 1e-9):.0f} pods/s), "
        f"DynamicResources Filter {filtered}; "
        f"load {r.load[0]:.2f}; setup {r.setup_s:.0f} s"
    )
    log.add(
        name,
        "-",
        value,
        "upstream scheduler_perf SchedulingWithResourceClaimTemplate, 500 nodes: 81-240 pods/s",
    )
    print(f"{name}: {value}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="100", help="node counts, comma-separated")
    parser.add_argument("--shapes", default="capacity,replicas,mig", help="comma-separated")
    parser.add_argument("--pods", type=int, default=500, help="pods measured per run")
    parser.add_argument(
        "--counter-pods",
        type=int,
        default=100,
        help="pods measured for shapes with counters (dynamic MIG: far slower to place)",
    )
    parser.add_argument("--warmup", type=int, default=50, help="pods placed before measuring")
    parser.add_argument("--replicas", type=int, default=8, help="shares per GPU (shared shapes)")
    parser.add_argument("--claims", choices=("template", "direct"), default="template")
    parser.add_argument("--width", type=int, default=16, help="pod creates in flight")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds for a batch")
    add_json_option(parser)
    args = parser.parse_args()
    log = FigureLog(args.json)
    if not realcluster.AVAILABLE:
        log.add("scheduler throughput", "-", f"not measured: {realcluster.SKIP_REASON}")
        print(realcluster.SKIP_REASON)
        return 0
    known = shapes(args.replicas)
    print(f"load average at start: {os.getloadavg()}", flush=True)
    for nodes in (int(n) for n in args.nodes.split(",")):
        for name in args.shapes.split(","):
            with realcluster.private() as cluster:
                result = asyncio.run(measure(cluster, known[name], nodes, args))
            report(result, args, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
