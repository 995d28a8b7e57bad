"""The fleet view: what a set of named configs does to every node of a cluster, before it applies.

Input is what `kubectl get nodes -o json` prints (a `List` of `Node`, already parsed). Each node
is taken as the daemon would take it: its `nvidia.com/device-plugin.config` label selects one
of the named configs (`select`, with the same fallbacks), and its GPUs are rebuilt from the GPU
labels GFD (or this plugin) put on it. The node is then planned with the same pipeline `plan`
and the daemon use, so a config that does not fit a node is reported as that node's errors, at
the config's lines, never raised.

A node whose labels do not describe GPUs is listed as skipped, with why.

Nodes with the same config and the same GPU labels plan alike, so each such shape is planned
once: a fleet of thousands of nodes is a few hundred shapes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from sharing_plugin.config.loader import LoadedConfig
from sharing_plugin.config.model import Config
from sharing_plugin.config.names import DEFAULT_CONFIG_LABEL
from sharing_plugin.config.selection import select
from sharing_plugin.errors import ConfigError, PlanError, SharingPluginError
from sharing_plugin.fleet.from_labels import NodeLabelsError, node_inventory
from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.plan.model import Plan
from sharing_plugin.plan.node import plan_node
from sharing_plugin.views.dra import dra_devices
from sharing_plugin.views.dra_mig import dynamic_pool
from sharing_plugin.views.labels import owns

__all__ = [
    "FleetView",
    "NodeLabelsError",
    "NodeResult",
    "NodeStatus",
    "NodesDocumentError",
    "ResourceCount",
    "fleet_view",
    "node_inventory",
]


class NodesDocumentError(SharingPluginError):
    """The nodes document is not what `kubectl get nodes -o json` prints."""


class NodeStatus(StrEnum):
    PLANNED = "planned"
    ERROR = "error"
    SKIPPED = "skipped"


@dataclass(frozen=True, slots=True)
class ResourceCount:
    """One resource a node would advertise: devices kubelet sees, physical devices behind, and
    what `run-dra` would publish of it (DRA devices, as the config's `dra.sharedDevices` says on
    a 1.34+ cluster, and how many claims that ask nothing fit on them)."""

    name: str
    devices: int
    physical: int
    sharing: str
    dra_devices: int = 0
    dra_claims: int = 0


@dataclass(frozen=True, slots=True)
class NodeResult:
    name: str
    status: NodeStatus
    config: str | None = None
    gpus: str = ""  # e.g. "8x NVIDIA A100-SXM4-80GB (MIG on 2)"
    resources: tuple[ResourceCount, ...] = ()
    mig: tuple[str, ...] = ()  # the declared layouts' actions, as `plan` prints them
    warnings: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    reason: str | None = None  # why it was skipped


@dataclass(frozen=True, slots=True)
class FleetView:
    nodes: tuple[NodeResult, ...]
    _by_status: dict[NodeStatus, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        counts = dict.fromkeys(NodeStatus, 0)
        for node in self.nodes:
            counts[node.status] += 1
        object.__setattr__(self, "_by_status", counts)

    def count(self, status: NodeStatus) -> int:
        return self._by_status[status]

    @property
    def has_errors(self) -> bool:
        return self.count(NodeStatus.ERROR) > 0

    def totals(self) -> list[dict[str, Any]]:
        """Per resource over the planned nodes: devices, physical devices, nodes; by name."""
        sums: dict[str, list[int]] = {}
        for node in self.nodes:
            for r in node.resources:
                row = sums.setdefault(r.name, [0, 0, 0, 0, 0])
                row[0] += r.devices
                row[1] += r.physical
                row[2] += 1
                row[3] += r.dra_devices
                row[4] += r.dra_claims
        return [
            {
                "name": name,
                "devices": d,
                "physical": p,
                "nodes": n,
                "dra": {"devices": dra, "claims": claims},
            }
            for name, (d, p, n, dra, claims) in sorted(sums.items())
        ]


# --- Planning each node ----------------------------------------------------------------------


def _items(document: Mapping[str, Any]) -> list[Any]:
    kind = document.get("kind") if isinstance(document, Mapping) else None
    if kind == "Node":
        return [document]
    items = document.get("items") if isinstance(document, Mapping) else None
    if kind not in ("List", "NodeList") or not isinstance(items, list):
        raise NodesDocumentError(
            "not a list of nodes: give what `kubectl get nodes -o json` prints "
            f"(kind List or NodeList with items; got kind {kind!r})"
        )
    return items


def _describe(inventory: Inventory) -> str:
    products: dict[str, int] = {}
    for gpu in inventory.gpus:
        products[gpu.product] = products.get(gpu.product, 0) + 1
    text = ", ".join(f"{n}x {p}" for p, n in products.items())
    mig = sum(1 for g in inventory.gpus if g.mig_enabled)
    return f"{text} (MIG on {mig})" if mig else text


def _planned(
    name: str,
    config_name: str | None,
    loaded: LoadedConfig,
    inventory: Inventory,
) -> NodeResult:
    gpus = _describe(inventory)
    try:
        node = plan_node(loaded.config, inventory)
    except ConfigError as exc:  # PlanError: the config does not fit this node
        errors = tuple(str(loaded.place(p)) for p in exc.problems)
        return NodeResult(name, NodeStatus.ERROR, config_name, gpus, errors=errors)
    dra = _dra_counts(loaded.config, node.plan, inventory)
    resources = tuple(
        ResourceCount(
            r.name,
            len(r.devices),
            len({d.physical for d in r.devices}),
            r.sharing.value,
            *dra.get(r.name, (0, 0)),
        )
        for r in node.plan.resources
        if r.devices
    )
    mig = tuple(text for action in node.actions for text in action.lines())
    errors = tuple(str(loaded.place(p)) for p in node.problems)
    return NodeResult(
        name,
        NodeStatus.ERROR if errors else NodeStatus.PLANNED,
        config_name,
        gpus,
        resources=() if errors else resources,
        mig=mig,
        warnings=node.warnings,
        errors=errors,
    )


def _dra_counts(config: Config, plan: Plan, inventory: Inventory) -> dict[str, tuple[int, int]]:
    """Resource -> (DRA devices, claims asking nothing that fit), as `run-dra` would publish."""
    try:
        devices = dra_devices(plan, inventory, shared=config.dra.shared_devices)
    except PlanError:  # what the API cannot carry: run-dra would refuse the config
        return {}
    dynamic = dynamic_pool(config, inventory)  # a dynamic GPU is its placements only
    counts: dict[str, tuple[int, int]] = {}
    for d in devices:
        if d.gpu_uuid in dynamic.gpu_uuids:
            continue
        published, claims = counts.get(d.resource, (0, 0))
        counts[d.resource] = (published + 1, claims + (d.shares.count if d.shares else 1))
    for gpu in dynamic.gpus:
        fit: dict[str, int] = {}  # claims of one placement each an empty GPU holds at most
        for p in gpu.placements:
            published, claims = counts.get(p.resource, (0, 0))
            counts[p.resource] = (published + 1, claims)
            fit[p.resource] = max(fit.get(p.resource, 0), p.spec.max_count)
        for resource, most in fit.items():
            published, claims = counts[resource]
            counts[resource] = (published, claims + most)
    return counts


Shape = tuple[tuple[str, str], ...]
"""The labels that decide what a node's GPUs are, sorted: nodes of one shape plan alike."""
Selected = tuple[str | None, LoadedConfig] | ConfigError


def _labels(item: Any) -> tuple[Mapping[str, Any], Mapping[str, Any] | None]:
    meta = item.get("metadata") if isinstance(item, Mapping) else None
    meta = meta if isinstance(meta, Mapping) else {}
    labels = meta.get("labels") or {}
    return meta, labels if isinstance(labels, Mapping) else None


def fleet_view(
    nodes: Mapping[str, Any],
    configs: Mapping[str | None, LoadedConfig],
    *,
    requested_name: str | None = None,
) -> FleetView:
    """Every node of `nodes` planned with the config its label selects (else `requested_name`,
    else `default`, else the only one). Raises NodesDocumentError only when `nodes` is not a
    list of nodes; every node's own trouble is in its result."""
    planned: dict[tuple[str | None, Shape], NodeResult] = {}
    inventories: dict[Shape, Inventory | NodeLabelsError] = {}
    selected: dict[str | None, Selected] = {}
    results: list[NodeResult] = []
    for position, item in enumerate(_items(nodes)):
        meta, labels = _labels(item)
        name = str(meta.get("name") or f"items[{position}]")
        if labels is None:
            results.append(NodeResult(name, NodeStatus.SKIPPED, reason="labels are not a map"))
            continue
        shape: Shape = tuple(
            sorted(
                (k, str(v))
                for k, v in labels.items()
                if isinstance(k, str) and k.startswith("nvidia.com/") and owns(k)
            )
        )
        if shape not in inventories:
            try:
                inventories[shape] = node_inventory(dict(shape))
            except NodeLabelsError as exc:
                inventories[shape] = exc
        inventory = inventories[shape]
        if isinstance(inventory, NodeLabelsError):
            results.append(NodeResult(name, NodeStatus.SKIPPED, reason=str(inventory)))
            continue
        label = labels.get(DEFAULT_CONFIG_LABEL)
        label = None if label is None else str(label)
        if label not in selected:
            try:
                selected[label] = select(configs, label, requested_name)
            except ConfigError as exc:
                selected[label] = exc
        choice = selected[label]
        if isinstance(choice, ConfigError):
            errors = tuple(p.message for p in choice.problems)
            gpus = _describe(inventory)
            results.append(NodeResult(name, NodeStatus.ERROR, gpus=gpus, errors=errors))
            continue
        config_name, loaded = choice
        key = (config_name, shape)
        if key not in planned:
            planned[key] = _planned("", config_name, loaded, inventory)
        results.append(replace(planned[key], name=name))
    return FleetView(tuple(results))
