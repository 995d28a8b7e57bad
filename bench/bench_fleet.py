"""Benchmark: the fleet view of 5,000 generated nodes (`plan --nodes NODES.json`).

The nodes are what `kubectl get nodes -o json` prints for a mixed cluster, labelled as
gpu-feature-discovery labels them: A100-40GB, A100-80GB, H100, H200, T4, L4 and A10 nodes of 1
to 8 GPUs, MIG nodes under the mixed and single strategies, nodes labelled while time-sliced,
GPU-less nodes; each has the ~30 ordinary labels and the status a real Node carries, and most
select one of the example configs (every file of config/examples is a key of one ConfigMap)
through `nvidia.com/device-plugin.config`. Measured: reading the JSON text, the fleet view,
and writing both its JSON document and its table, as the command does; goal <= 5 s, held by
the slowest round (the first: later ones reuse MIG placements solved in this process). The
baseline is the JSON text read and written back without planning anything.

Run from the repository root: `.venv/bin/python bench/bench_fleet.py` (`--nodes N`,
`--rounds N`, `--json PATH` to also write the figures for `make bench`).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

from figures import FigureLog, add_json_option, ms

from sharing_plugin.cli.render import fleet_json, fleet_table
from sharing_plugin.config.loader import parse_configs
from sharing_plugin.fleet.view import NodeStatus, fleet_view

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "config" / "examples"
GOAL_S = 5.0

# (product label, memory MiB, MIG-capable, compute major, minor)
WHOLE = [
    ("NVIDIA-A100-SXM4-40GB", 40960, True, 8, 0),
    ("NVIDIA-A100-SXM4-80GB", 81920, True, 8, 0),
    ("NVIDIA-H100-80GB-HBM3", 81559, True, 9, 0),
    ("NVIDIA-H200", 143771, True, 9, 0),
    ("Tesla-T4", 15360, False, 7, 5),
    ("NVIDIA-L4", 23034, False, 8, 9),
    ("NVIDIA-A10", 23028, False, 8, 6),
]
# Mixed-strategy A100-80GB layouts per GPU, as mig-<profile>.count labels add them up.
LAYOUTS = [
    {"1g.10gb": 7},
    {"3g.40gb": 2},
    {"2g.20gb": 3, "1g.10gb": 1},
    {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1},
    {"7g.80gb": 1},
]


def configmap() -> str:
    """Every example config as one key of a ConfigMap manifest."""
    lines = ["apiVersion: v1", "kind: ConfigMap", "metadata:", "  name: fleet", "data:"]
    for path in sorted(EXAMPLES.glob("*.yaml")):
        lines.append(f"  {path.stem}: |")
        lines += [f"    {line}" for line in path.read_text().splitlines()]
    lines += ["  default: |", "    version: v1"]
    return "\n".join(lines) + "\n"


def ordinary_labels(name: str, rng: random.Random) -> dict[str, str]:
    zone = rng.choice("abc")
    labels = {
        "beta.kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "node.kubernetes.io/instance-type": rng.choice(["p4d.24xlarge", "g4dn.12xlarge"]),
        "topology.kubernetes.io/region": "us-east-1",
        "topology.kubernetes.io/zone": f"us-east-1{zone}",
        "nvidia.com/cuda.driver-version.full": "550.54.15",
        "nvidia.com/cuda.driver.major": "550",
        "nvidia.com/cuda.runtime-version.full": "12.4",
        "nvidia.com/gfd.timestamp": str(1_700_000_000 + rng.randrange(10**6)),
        "nvidia.com/gpu.deploy.device-plugin": "true",
        "nvidia.com/gpu.present": "true",
        "feature.node.kubernetes.io/pci-10de.present": "true",
    }
    labels.update({f"feature.node.kubernetes.io/cpu-cpuid.FEAT{i}": "true" for i in range(15)})
    return labels


def gpu_labels(rng: random.Random) -> dict[str, str]:
    kind = rng.random()
    if kind < 0.05:
        return {}  # a CPU node
    if kind < 0.20:  # MIG, mixed: A100-80GB, 1-8 GPUs, each with one of LAYOUTS
        gpus = rng.randint(1, 8)
        counts: dict[str, int] = {}
        for _ in range(gpus):
            for profile, n in rng.choice(LAYOUTS).items():
                counts[profile] = counts.get(profile, 0) + n
        labels = {
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
            "nvidia.com/gpu.count": str(gpus),
            "nvidia.com/gpu.memory": "81920",
            "nvidia.com/gpu.replicas": "0",
            "nvidia.com/mig.capable": "true",
            "nvidia.com/mig.strategy": "mixed",
        }
        for profile, n in counts.items():
            labels[f"nvidia.com/mig-{profile}.count"] = str(n)
        return labels
    if kind < 0.25:  # MIG, single: 8 A100-40GB as 1g.5gb
        return {
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
            "nvidia.com/gpu.count": "56",
            "nvidia.com/gpu.memory": "4864",
            "nvidia.com/gpu.replicas": "1",
            "nvidia.com/mig.capable": "true",
            "nvidia.com/mig.strategy": "single",
        }
    product, memory, mig, major, minor = rng.choice(WHOLE)
    shared = rng.random() < 0.3  # labelled while time-sliced
    return {
        "nvidia.com/gpu.product": product + ("-SHARED" if shared else ""),
        "nvidia.com/gpu.count": str(rng.choice([1, 2, 4, 8, 8, 8])),
        "nvidia.com/gpu.memory": str(memory),
        "nvidia.com/gpu.replicas": "4" if shared else "1",
        "nvidia.com/gpu.sharing-strategy": "time-slicing" if shared else "none",
        "nvidia.com/gpu.family": "ampere",
        "nvidia.com/gpu.compute.major": str(major),
        "nvidia.com/gpu.compute.minor": str(minor),
        "nvidia.com/mig.capable": "true" if mig else "false",
    }


def nodes_json(count: int, config_names: list[str], seed: int = 17) -> str:
    rng = random.Random(seed)
    items: list[dict[str, Any]] = []
    for i in range(count):
        name = f"gpu-node-{i:05d}"
        labels = {**ordinary_labels(name, rng), **gpu_labels(rng)}
        if rng.random() < 0.8:
            labels["nvidia.com/device-plugin.config"] = rng.choice(config_names)
        items.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "uid": f"{i:08x}-0000-4000-8000-000000000000",
                    "resourceVersion": str(1000 + i),
                    "labels": labels,
                    "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
                },
                "spec": {"podCIDR": f"10.{i // 256 % 256}.{i % 256}.0/24"},
                "status": {
                    "capacity": {"cpu": "96", "memory": "1056768000Ki", "pods": "110"},
                    "allocatable": {"cpu": "95", "memory": "1046768000Ki", "pods": "110"},
                    "addresses": [{"type": "InternalIP", "address": f"10.0.{i // 256}.{i % 256}"}],
                    "conditions": [{"type": "Ready", "status": "True"}],
                    "nodeInfo": {"kubeletVersion": "v1.30.2", "osImage": "Ubuntu 22.04"},
                },
            }
        )
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": items})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3, help="runs; the slowest is reported")
    add_json_option(parser)
    args = parser.parse_args()
    log = FigureLog(args.json)
    named = parse_configs(configmap(), file="fleet-configmap.yaml")
    names = [str(n) for n in named if n is not None]
    text = nodes_json(args.nodes, [*names, "no-such-config"])
    totals: list[float] = []
    floors: list[float] = []
    for _ in range(args.rounds):
        started = time.perf_counter()
        document = json.loads(text)
        view = fleet_view(document, named)
        out = json.dumps(fleet_json(view))
        table = fleet_table(view)
        totals.append(time.perf_counter() - started)
        started = time.perf_counter()
        json.dumps(json.loads(text))
        floors.append(time.perf_counter() - started)
    # The first round is the slowest: MIG placements are solved once per process and reused.
    total, floor = max(totals), statistics.median(floors)
    counts = ", ".join(f"{view.count(s)} {s.value}" for s in NodeStatus)
    print(f"{args.nodes:,} nodes ({len(text) / 1e6:.1f} MB of JSON): {counts}")
    print(f"JSON out {len(out) / 1e6:.1f} MB, table {len(table.splitlines()):,} lines")
    print(f"fleet view, read + plan + write:  {ms(total)}  (goal <= {GOAL_S:.0f} s; slowest round)")
    print(f"  every round: {', '.join(ms(t) for t in totals)}")
    print(f"JSON read + write alone:          {ms(floor)}")
    log.add(
        f"fleet view: {args.nodes:,} generated nodes, read + plan + JSON and table",
        f"<= {GOAL_S:.0f} s",
        ms(total),
        f"JSON read + write alone {ms(floor)}",
    )


if __name__ == "__main__":
    main()
