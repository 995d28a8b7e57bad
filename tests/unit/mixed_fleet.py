"""A generated mixed cluster, as a new user's would be: simulated node descriptions per node.

Nodes of the catalogued models, 1 to 8 GPUs each, some without GPUs. MIG-capable nodes are
partitioned as mig-parted partitions them: one configuration for every GPU (`all-<profile>`,
`all-balanced`: two of the smallest 1g, one 2g and one 3g profile; `all-enabled`: MIG on,
nothing created), or a custom one with a configuration (or MIG off) per GPU. Each GPU's
layout is one the model's placement rules allow, so every GPU node can be planned.

Each node is labelled as it labels itself (GFD's labels, from its own plan on the simulated
node), so the fleet view sees what `kubectl get nodes -o json` would show. Run as a script, it
says how many GPU nodes of such a fleet the fleet view skips (it should be none):
`.venv/bin/python tests/unit/mixed_fleet.py [--nodes 200] [--seed 2]`.
"""

from __future__ import annotations

import argparse
import random
from functools import cache
from typing import Any

from sharing_plugin.config.loader import NamedConfigs, parse_configs
from sharing_plugin.errors import MigError
from sharing_plugin.fleet.view import NodeStatus, fleet_view
from sharing_plugin.gpus.catalog import GpuModel, model_for
from sharing_plugin.mig import validate_layout
from sharing_plugin.nvml.discover import discover
from sharing_plugin.plan.node import NodePlan, plan_node
from sharing_plugin.sim.nvml.node import LoadedNode, NodeDescription
from sharing_plugin.sim.nvml.simulated import SimulatedNvml
from sharing_plugin.views.labels import labels

MIG_PRODUCTS = (
    "NVIDIA A100-SXM4-80GB",
    "NVIDIA A100-SXM4-40GB",
    "NVIDIA H100 80GB HBM3",
    "NVIDIA H200",
    "NVIDIA A30",
)
WHOLE_PRODUCTS = ("Tesla T4", "NVIDIA L4")
GPU_COUNTS = (1, 2, 4, 8, 8)


def _model(product: str) -> GpuModel:
    model = model_for(product)
    assert model is not None and model.mig is not None
    return model


@cache
def mig_configs(product: str) -> tuple[tuple[str, ...], ...]:
    """mig-parted-style layouts of one GPU (profile names, one per instance), `all-enabled`
    (no instance) first."""
    model = _model(product)
    assert model.mig is not None
    layouts: list[tuple[str, ...]] = [()]
    layouts += [(p.name,) * p.max_count for p in model.mig.profiles]
    smallest: dict[int, str] = {}
    for p in sorted(model.mig.profiles, key=lambda p: p.memory_slices):
        if not p.media_extensions:
            smallest.setdefault(p.compute_slices, p.name)
    balanced = [smallest[1], smallest[1], smallest[2], *([smallest[3]] if 3 in smallest else [])]
    layouts.append(tuple(balanced))
    for layout in layouts:
        try:
            validate_layout(model, {n: layout.count(n) for n in layout})
        except MigError as exc:  # pragma: no cover - a catalog change broke the generator
            raise AssertionError(f"{product}: {layout} does not fit") from exc
    return tuple(layouts)


def gpu_groups(rng: random.Random) -> list[dict[str, Any]] | None:
    """One node's `gpus` (a node description's list), or None for a node without GPUs."""
    kind = rng.random()
    if kind < 0.125:
        return None
    count = rng.choice(GPU_COUNTS)
    if kind < 0.3:
        return [{"product": rng.choice(WHOLE_PRODUCTS), "count": count}]
    product = rng.choice(MIG_PRODUCTS)
    if kind < 0.45:  # MIG-capable, MIG off
        return [{"product": product, "count": count}]
    configs = mig_configs(product)
    if kind < 0.8:  # one configuration for every GPU
        layout = rng.choice(configs)
        return [{"product": product, "count": count, "mig": {"instances": list(layout)}}]
    groups: list[dict[str, Any]] = []
    for _ in range(count):  # custom: a configuration, or MIG off, per GPU
        if rng.random() < 0.2:
            groups.append({"product": product})
        else:
            groups.append({"product": product, "mig": {"instances": list(rng.choice(configs))}})
    return groups


def mixed_fleet(rng: random.Random, nodes: int) -> list[tuple[str, list[dict[str, Any]] | None]]:
    """`nodes` nodes: (name, its GPU groups or None)."""
    return [(f"node-{i:03d}", gpu_groups(rng)) for i in range(nodes)]


Fleet = list[tuple[str, list[dict[str, Any]] | None]]
MIXED = "version: v1\nflags:\n  migStrategy: mixed\n"


def mixed_config() -> NamedConfigs:
    return parse_configs(MIXED, file="mixed.yaml")


def simulated(name: str, gpus: list[dict[str, Any]]) -> SimulatedNvml:
    """The simulated NVML of a node with these GPU groups, as `--gpus simulated:FILE` runs it."""
    description = NodeDescription.model_validate({"gpus": gpus})
    return SimulatedNvml(LoadedNode(description=description, identity=name, path=None))


def labelled(fleet: Fleet, named: NamedConfigs) -> tuple[dict[str, Any], dict[str, NodePlan]]:
    """The nodes as `kubectl get nodes -o json` lists them, each labelled from its own plan under
    the config `named` selects for it; and each GPU node's plan, as `plan --gpus` makes it."""
    items, plans = [], {}
    config = named[None].config
    for name, gpus in fleet:
        node_labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}
        if gpus is not None:
            plans[name] = plan_node(config, discover(simulated(name, gpus)))
            node_labels |= labels(config, plans[name])
        items.append({"kind": "Node", "metadata": {"name": name, "labels": node_labels}})
    return {"apiVersion": "v1", "kind": "List", "items": items}, plans


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--seed", type=int, default=2)
    args = parser.parse_args()
    fleet = mixed_fleet(random.Random(args.seed), args.nodes)
    named = mixed_config()
    document, _ = labelled(fleet, named)
    view = fleet_view(document, named)
    gpu_nodes = [r for (_, gpus), r in zip(fleet, view.nodes, strict=True) if gpus is not None]
    skipped = [r for r in gpu_nodes if r.status is NodeStatus.SKIPPED]
    print(f"{len(skipped)} of {len(gpu_nodes)} GPU nodes skipped (seed {args.seed})")
    for r in skipped:
        print(f"  {r.name}: {r.reason}")


if __name__ == "__main__":
    main()
