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
`mig` (dynamic MIG: 200 placements, 25 per GPU, counters; claims ask a 1g.10gb). Extra shapes to
compare (not the product's): `mig-1g` (only the 1g.10gb placements published, with counters).

Kubelet-less nodes: the node-lifecycle controller taints them (not-ready / unreachable); the
bench pods tolerate every taint (`operator: Exists`) rather than faking node heartbeats.

    .venv/bin/python bench/bench_scheduler.py --nodes 100 --pods 300          # quick
    .venv/bin/python bench/bench_scheduler.py --nodes 100,500 --pods 1000 --json /tmp/s.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import httpx2  # noqa: E402
import realcluster  # noqa: E402
import yaml  # noqa: E402
from figures import FigureLog, add_json_option, ms, p50_p99  # noqa: E402
from kustomize_render import render  # noqa: E402
from realcluster_support import DEPLOY_DRA, DRIVER  # noqa: E402

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


def fake_node(name: str) -> dict[str, Any]:
    capacity = {"cpu": "224", "memory": "2Ti", "pods": "110"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "bench": "sched"}},
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": [{"type": "Ready", "status": "True", "reason": "Bench"}],
        },
    }


def claim_spec(device_class: str) -> dict[str, Any]:
    request = {"name": "gpu", "exactly": {"deviceClassName": device_class}}
    return {"devices": {"requests": [request]}}


def pod(name: str, *, template: str | None = None, claim: str | None = None) -> dict[str, Any]:
    source = {"resourceClaimTemplateName": template} if template else {"resourceClaimName": claim}
    container = {
        "name": "main",
        "image": "registry.k8s.io/pause:3.10",
        "resources": {"claims": [{"name": "gpu"}]},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [container],
            "resourceClaims": [{"name": "gpu", **source}],
            "tolerations": [{"operator": "Exists"}],  # kubelet-less nodes get tainted
            "nodeSelector": {"bench": "sched"},
            "terminationGracePeriodSeconds": 0,
        },
    }


class Api:
    """The admin's plain JSON calls (no typed models: the bench client shares 2 cores)."""

    def __init__(self, cluster: realcluster.RealCluster, token: str) -> None:
        headers = {"Authorization": f"Bearer {token}"}
        limits = httpx2.Limits(max_connections=32)
        self.http = httpx2.AsyncClient(
            base_url=cluster.url,
            verify=str(cluster.ca),
            headers=headers,
            limits=limits,
            timeout=120,
        )

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        answer = await self.http.post(path, json=body)
        if answer.status_code >= 300:
            raise RuntimeError(f"POST {path}: {answer.status_code} {answer.text[:400]}")
        created: dict[str, Any] = answer.json()
        return created

    async def get(self, path: str) -> dict[str, Any]:
        answer = await self.http.get(path)
        answer.raise_for_status()
        found: dict[str, Any] = answer.json()
        return found


async def gathered(calls: Iterable[Awaitable[Any]], width: int = 16) -> None:
    """Await `calls`, at most `width` at once."""
    gate = asyncio.Semaphore(width)

    async def one(call: Awaitable[Any]) -> None:
        async with gate:
            await call

    await asyncio.gather(*(one(c) for c in calls))


@dataclass
class Binds:
    """Pods of a namespace bound to a node, as a watch sees them: name -> perf_counter."""

    at: dict[str, float] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def follow(self, api: Api, namespace: str) -> None:
        """Until cancelled; a watch that ends or fails is resumed where it was."""
        path = f"/api/v1/namespaces/{namespace}/pods"
        version = (await api.get(path))["metadata"]["resourceVersion"]
        while True:
            params = {"watch": "1", "resourceVersion": version, "allowWatchBookmarks": "true"}
            try:
                async with api.http.stream("GET", path, params=params, timeout=None) as lines:
                    async for line in lines.aiter_lines():
                        obj = json.loads(line).get("object", {})
                        meta = obj.get("metadata", {})
                        version = meta.get("resourceVersion", version)
                        name = meta.get("name")
                        if obj.get("spec", {}).get("nodeName") and name not in self.at:
                            self.at[name] = time.perf_counter()
                            self.changed.set()
            except (httpx2.HTTPError, ValueError) as exc:
                print(f"pod watch: {exc!r}; resumed", file=sys.stderr, flush=True)

    async def all_of(self, names: set[str], within: float) -> None:
        deadline = time.perf_counter() + within
        while not names <= self.at.keys():
            self.changed.clear()
            left = deadline - time.perf_counter()
            if left <= 0:
                raise TimeoutError(f"{len(names - self.at.keys())} of {len(names)} pods unbound")
            try:
                await asyncio.wait_for(self.changed.wait(), left)
            except TimeoutError:
                continue


_METRIC = re.compile(r"^(\w+)(?:\{(.*)\})? (\S+)$")


async def scheduler_metrics(api: Api, port: int) -> dict[str, float]:
    """The sums and counts of the scheduler's algorithm (PreFilter to Score, one pod at a
    time; binding is not in it) and of the DynamicResources Filter (per node)."""
    # The scheduler serves a self-signed certificate of its own, on loopback.
    async with httpx2.AsyncClient(verify=False, headers=api.http.headers) as plain:
        answer = await plain.get(f"https://127.0.0.1:{port}/metrics")
    wanted: dict[str, float] = {}
    for line in answer.text.splitlines():
        m = _METRIC.match(line)
        if m is None:
            continue
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        if name.startswith("scheduler_scheduling_algorithm_duration_seconds_"):
            key = "algorithm_" + name.rsplit("_", 1)[1]
        elif name.startswith("scheduler_plugin_execution_duration_seconds_") and (
            'plugin="DynamicResources"' in labels and 'extension_point="Filter"' in labels
        ):
            key = "filter_" + name.rsplit("_", 1)[1]
        elif name == "rest_client_rate_limiter_duration_seconds_sum":
            key = "throttled_sum"  # waits on the scheduler's own client QPS limit
        elif name == "rest_client_requests_total" and 'method="GET"' not in labels:
            key = "writes_sum"
        else:
            continue
        if key.endswith(("_sum", "_count")):
            wanted[key] = wanted.get(key, 0.0) + value
    return wanted


@dataclass(frozen=True)
class Result:
    shape: str
    nodes: int
    pods: int
    slices: int
    devices: int  # per node
    setup_s: float
    created_s: float  # first create -> last create answered
    bound_s: float  # first create -> last bind seen
    latency: tuple[float, float]  # create answered -> bound, p50 / p99
    algorithm_s: float  # the scheduler's mean algorithm time per pod over the batch
    filter_s: float  # DynamicResources Filter, mean per node evaluated
    throttled_s: float  # the scheduler's waits on its client's QPS limit, summed
    writes: float  # the scheduler's API writes per pod
    load: tuple[float, ...]

    @property
    def rate(self) -> float:
        return self.pods / self.bound_s


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
        await binds.all_of(set(pods), within=args.timeout)
        return start, created, answered

    await batch("w", args.warmup)
    setup = time.perf_counter() - began
    metrics_before = await scheduler_metrics(api, ready["scheduler_port"])
    start, created, answered = await batch("p", args.pods)
    metrics_after = await scheduler_metrics(api, ready["scheduler_port"])
    load = os.getloadavg()
    watch.cancel()
    await api.http.aclose()
    bound = [binds.at[p] for p in answered]
    delta = {k: metrics_after.get(k, 0.0) - metrics_before.get(k, 0.0) for k in metrics_after}
    return Result(
        shape=shape.name,
        nodes=nodes,
        pods=args.pods,
        slices=len(per_node),
        devices=sum(len(s["spec"].get("devices") or ()) for s in per_node),
        setup_s=setup,
        created_s=created,
        bound_s=max(bound) - start,
        latency=p50_p99([binds.at[p] - t for p, t in answered.items()]),
        algorithm_s=delta.get("algorithm_sum", 0.0) / max(delta.get("algorithm_count", 0.0), 1.0),
        filter_s=delta.get("filter_sum", 0.0) / max(delta.get("filter_count", 0.0), 1.0),
        throttled_s=delta.get("throttled_sum", 0.0),
        writes=delta.get("writes_sum", 0.0) / args.pods,
        load=load,
    )


def report(result: Result, args: argparse.Namespace, log: FigureLog) -> None:
    r = result
    claims = "claims from a template" if args.claims == "template" else "claims made beforehand"
    name = (
        f"scheduler throughput, {r.nodes} nodes x 8 H100, {r.shape} "
        f"({r.slices} slice(s), {r.devices} devices per node), {claims}"
    )
    value = (
        f"{r.rate:.1f} pods/s ({r.pods} pods bound in {r.bound_s:.1f} s; created in "
        f"{r.created_s:.1f} s; create -> bound p50 {ms(r.latency[0])}, p99 {ms(r.latency[1])}); "
        f"scheduler: mean algorithm {ms(r.algorithm_s)} per pod "
        f"(1 / it: {1 / max(r.algorithm_s, 1e-9):.0f} pods/s), "
        f"DynamicResources Filter {ms(r.filter_s)} per node, {r.writes:.1f} API writes per "
        f"pod, {r.throttled_s:.0f} s waiting on its client QPS limit (summed); "
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
