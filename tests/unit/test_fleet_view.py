"""The fleet view: a generated cluster's nodes, labelled as gpu-feature-discovery labels them,
planned with the named configs their labels select."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mixed_fleet import labelled, mixed_config, mixed_fleet, simulated

from sharing_plugin.cli.render import fleet_json, fleet_table
from sharing_plugin.config.loader import NamedConfigs, parse_configs
from sharing_plugin.config.model import Config
from sharing_plugin.errors import PlanError
from sharing_plugin.fleet.view import (
    NodeLabelsError,
    NodesDocumentError,
    NodeStatus,
    fleet_view,
    node_inventory,
)
from sharing_plugin.nvml.discover import discover
from sharing_plugin.plan.node import plan_node
from sharing_plugin.sim.nvml.simulated import SimulatedNvml
from sharing_plugin.views.labels import labels

CONFIGMAP = """\
apiVersion: v1
kind: ConfigMap
metadata:
  name: plugin-configs
data:
  default: |
    version: v1
  ts-4: |
    version: v1
    sharing:
      timeSlicing:
        resources:
          - name: nvidia.com/gpu
            replicas: 4
  mixed: |
    version: v1
    flags:
      migStrategy: mixed
    sharing:
      timeSlicing:
        resources:
          - name: nvidia.com/mig-1g.10gb
            replicas: 2
  single: |
    version: v1
    flags:
      migStrategy: single
  pinned: |
    version: v1
    sharing:
      timeSlicing:
        resources:
          - name: gpu
            devices: [0, 1, 2, 3]
            replicas: 2
"""

CONFIG_LABEL = "nvidia.com/device-plugin.config"


def configs(tmp_path: Path | None = None) -> tuple[NamedConfigs, str]:
    file = str(tmp_path / "configs.yaml") if tmp_path else "configs.yaml"
    if tmp_path:
        Path(file).write_text(CONFIGMAP)
    return parse_configs(CONFIGMAP, file=file), file


def whole(product: str, count: int, memory: int, *, mig_capable: bool) -> dict[str, str]:
    """What GFD publishes for whole GPUs (its README's Generated Labels)."""
    return {
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.count": str(count),
        "nvidia.com/gpu.memory": str(memory),
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/mig.capable": "true" if mig_capable else "false",
    }


# Node kinds of the generated cluster, labelled as GFD labels them.
KINDS: dict[str, dict[str, str]] = {
    "a100-40": whole("NVIDIA-A100-SXM4-40GB", 8, 40960, mig_capable=True),
    "a100-80": whole("NVIDIA-A100-SXM4-80GB", 8, 81920, mig_capable=True),
    "h100": whole("NVIDIA-H100-80GB-HBM3", 8, 81559, mig_capable=True),
    "t4": whole("Tesla-T4", 4, 15360, mig_capable=False),
    # Labelled while time-sliced: -SHARED and replicas 4 do not change what the GPUs are.
    "t4-small-shared": {
        **whole("Tesla-T4-SHARED", 2, 15360, mig_capable=False),
        "nvidia.com/gpu.replicas": "4",
        "nvidia.com/gpu.sharing-strategy": "time-slicing",
    },
    # Mixed strategy, both A100-80GB cut into seven 1g.10gb: no GPU advertised whole.
    "mig-mixed": {
        **whole("NVIDIA-A100-SXM4-80GB", 2, 81920, mig_capable=True),
        "nvidia.com/gpu.replicas": "0",
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/mig-1g.10gb.count": "14",
        "nvidia.com/mig-1g.10gb.memory": "9728",
        "nvidia.com/mig-1g.10gb.product": "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb",
    },
    # Single strategy, the GFD README's example: 8 A100-40GB as 56 1g.5gb.
    "mig-single": {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
        "nvidia.com/gpu.count": "56",
        "nvidia.com/gpu.memory": "4864",
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mig.strategy": "single",
    },
    "unlabelled": {},
}

# (kind, config) -> {resource: (devices, physical)}, or an error / skip marker.
ERROR = "error"
SKIPPED = "skipped"
EXPECTED: dict[tuple[str, str], dict[str, tuple[int, int]] | str] = {
    ("a100-40", "default"): {"nvidia.com/gpu": (8, 8)},
    ("a100-40", "ts-4"): {"nvidia.com/gpu": (32, 8)},
    ("a100-80", "ts-4"): {"nvidia.com/gpu": (32, 8)},
    ("a100-80", "pinned"): {"nvidia.com/gpu": (12, 8)},  # 4 x 2 replicas + 4 whole
    ("h100", "default"): {"nvidia.com/gpu": (8, 8)},
    ("h100", "mixed"): {"nvidia.com/gpu": (8, 8)},  # no MIG on: whole GPUs
    ("t4", "ts-4"): {"nvidia.com/gpu": (16, 4)},
    ("t4", "pinned"): {"nvidia.com/gpu": (8, 4)},
    ("t4-small-shared", "ts-4"): {"nvidia.com/gpu": (8, 2)},
    ("t4-small-shared", "pinned"): ERROR,  # GPUs 2 and 3 do not exist
    ("mig-mixed", "mixed"): {"nvidia.com/mig-1g.10gb": (28, 14)},
    ("mig-mixed", "default"): {"nvidia.com/gpu": (2, 2)},  # migStrategy none: whole GPUs
    ("mig-mixed", "single"): {"nvidia.com/gpu": (14, 14)},
    ("mig-single", "single"): {"nvidia.com/gpu": (56, 56)},
    ("mig-single", "mixed"): {"nvidia.com/mig-1g.5gb": (56, 56)},
    ("mig-single", "unknown-name"): ERROR,
    ("unlabelled", "default"): SKIPPED,
    ("unlabelled", "ts-4"): SKIPPED,
}


def generated_cluster(nodes: int) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """A `kubectl get nodes -o json` List cycling through EXPECTED's (kind, config) pairs."""
    pairs = list(EXPECTED)
    items, chosen = [], []
    for i in range(nodes):
        kind, config_name = pairs[i % len(pairs)]
        node_labels = {
            "kubernetes.io/hostname": f"node-{i:04d}",
            "kubernetes.io/os": "linux",
            **KINDS[kind],
        }
        if config_name != "default" or i % 2:  # unlabelled nodes fall back to `default`
            node_labels[CONFIG_LABEL] = config_name
        items.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": f"node-{i:04d}", "labels": node_labels},
                "status": {"capacity": {"cpu": "64"}},
            }
        )
        chosen.append((kind, config_name))
    return {"apiVersion": "v1", "kind": "List", "items": items}, chosen


def test_generated_cluster_every_node_as_expected_and_totals_add_up() -> None:
    named, _ = configs()
    document, chosen = generated_cluster(3 * len(EXPECTED))
    view = fleet_view(document, named)
    totals: dict[str, list[int]] = {}
    for result, (kind, config_name) in zip(view.nodes, chosen, strict=True):
        want = EXPECTED[(kind, config_name)]
        if want == SKIPPED:
            assert result.status is NodeStatus.SKIPPED, result
            assert result.reason is not None and "no GPU labels" in result.reason
            continue
        if want == ERROR:
            assert result.status is NodeStatus.ERROR, result
            assert result.errors and not result.resources
            continue
        assert isinstance(want, dict)
        assert result.status is NodeStatus.PLANNED, result
        assert result.config == config_name
        assert {r.name: (r.devices, r.physical) for r in result.resources} == want
        for name, (devices, physical) in want.items():
            row = totals.setdefault(name, [0, 0, 0])
            row[0], row[1], row[2] = row[0] + devices, row[1] + physical, row[2] + 1
    # In DRA mode (by capacity, as no config says otherwise) a node publishes one device per
    # physical device, on which as many claims that ask nothing fit as it has replicas.
    assert view.totals() == [
        {"name": name, "devices": d, "physical": p, "nodes": n, "dra": {"devices": p, "claims": d}}
        for name, (d, p, n) in sorted(totals.items())
    ]
    skipped = sum(1 for pair in chosen if EXPECTED[pair] == SKIPPED)
    errors = sum(1 for pair in chosen if EXPECTED[pair] == ERROR)
    assert view.count(NodeStatus.SKIPPED) == skipped
    assert view.count(NodeStatus.ERROR) == errors and view.has_errors


def test_error_entries_say_what_is_wrong_at_the_configs_line(tmp_path: Path) -> None:
    named, file = configs(tmp_path)
    document, _ = generated_cluster(len(EXPECTED))
    view = fleet_view(document, named)
    by_pair = dict(zip(EXPECTED, view.nodes, strict=True))
    pinned = by_pair[("t4-small-shared", "pinned")]
    assert pinned.config == "pinned"
    line = re.escape(file) + r":\d+:\d+: data\.pinned: sharing\.timeSlicing\.resources\[0\]"
    assert re.match(line + r"\.devices\[2\]: GPU 2 does not exist", pinned.errors[0])
    unknown = by_pair[("mig-single", "unknown-name")]
    assert unknown.config is None
    assert "unknown config name 'unknown-name' (node label)" in unknown.errors[0]


def test_json_document_and_table() -> None:
    named, _ = configs()
    document, _ = generated_cluster(len(EXPECTED))
    view = fleet_view(document, named)
    out = json.loads(json.dumps(fleet_json(view)))
    assert out["totals"]["nodes"] == {
        "total": len(EXPECTED),
        "planned": view.count(NodeStatus.PLANNED),
        "error": 2,
        "skipped": 2,
    }
    first = out["nodes"][0]
    assert set(first) == {
        "name",
        "status",
        "config",
        "gpus",
        "resources",
        "mig",
        "warnings",
        "errors",
        "reason",
    }
    assert first["resources"] == [
        {
            "name": "nvidia.com/gpu",
            "devices": 8,
            "physical": 8,
            "sharing": "none",
            "dra": {"devices": 8, "claims": 8},
        }
    ]
    assert first["gpus"] == "8x NVIDIA A100-SXM4-40GB"
    assert out["totals"]["resources"] == view.totals()
    table = fleet_table(view)
    assert "node-0001" in table and "skipped: no GPU labels" in table
    assert "  error: " in table
    assert f"cluster total ({len(EXPECTED)} nodes:" in table


def test_nodes_of_one_shape_share_one_plan_but_keep_their_names() -> None:
    named, _ = configs()
    items = [
        {"metadata": {"name": f"t4-{i}", "labels": {**KINDS["t4"], CONFIG_LABEL: "ts-4"}}}
        for i in range(3)
    ]
    view = fleet_view({"kind": "NodeList", "items": items}, named)
    assert [n.name for n in view.nodes] == ["t4-0", "t4-1", "t4-2"]
    assert len({n.resources for n in view.nodes}) == 1


def test_one_node_document_and_requested_name() -> None:
    named, _ = configs()
    one = {"kind": "Node", "metadata": {"name": "solo", "labels": KINDS["t4"]}}
    (result,) = fleet_view(one, named, requested_name="ts-4").nodes
    assert result.config == "ts-4"
    assert result.resources[0].devices == 16


@pytest.mark.parametrize(
    "document",
    [{}, {"kind": "List"}, {"kind": "Pod", "items": []}, {"kind": "List", "items": {}}],
)
def test_what_is_not_a_list_of_nodes_is_refused(document: dict[str, Any]) -> None:
    named, _ = configs()
    with pytest.raises(NodesDocumentError, match="kubectl get nodes -o json"):
        fleet_view(document, named)


def test_malformed_items_are_listed_not_raised() -> None:
    named, _ = configs()
    view = fleet_view({"kind": "List", "items": [42, {"metadata": {"labels": ["x"]}}]}, named)
    assert [(n.name, n.status) for n in view.nodes] == [
        ("items[0]", NodeStatus.SKIPPED),
        ("items[1]", NodeStatus.SKIPPED),
    ]


# --- GPUs from labels ---------------------------------------------------------------------


def test_catalog_fills_what_the_labels_leave_out() -> None:
    inventory = node_inventory({"nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.count": "2"})
    assert [(g.product, g.memory_mib, g.compute_capability) for g in inventory.gpus] == [
        ("Tesla T4", 15360, (7, 5)),
        ("Tesla T4", 15360, (7, 5)),
    ]


def test_an_uncatalogued_product_keeps_its_label_and_labelled_facts() -> None:
    inventory = node_inventory(
        {
            "nvidia.com/gpu.product": "NVIDIA-L40",
            "nvidia.com/gpu.count": "3",
            "nvidia.com/gpu.memory": "46068",
            "nvidia.com/gpu.compute.major": "8",
            "nvidia.com/gpu.compute.minor": "9",
        }
    )
    gpu = inventory.gpus[0]
    assert (gpu.product, gpu.memory_mib, gpu.compute_capability) == ("NVIDIA-L40", 46068, (8, 9))
    assert len(inventory.gpus) == 3 and not gpu.mig_capable


def test_pre_r470_product_names_resolve() -> None:
    inventory = node_inventory(
        {"nvidia.com/gpu.product": "A100-SXM4-40GB", "nvidia.com/gpu.count": "1"}
    )
    assert inventory.gpus[0].product == "NVIDIA A100-SXM4-40GB"
    assert inventory.gpus[0].mig_capable


def test_mixed_mig_devices_are_packed_onto_as_few_gpus_as_fit() -> None:
    labels_ = {
        **whole("NVIDIA-A100-SXM4-80GB", 4, 81920, mig_capable=True),
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/mig-3g.40gb.count": "1",
        "nvidia.com/mig-1g.10gb.count": "7",
        "nvidia.com/mig-1g.10gb.me.count": "1",
    }
    inventory = node_inventory(labels_)
    layouts = [sorted(m.profile for m in g.mig_devices) for g in inventory.gpus]
    assert [g.mig_enabled for g in inventory.gpus] == [True, True, False, False]
    assert sorted(p for layout in layouts for p in layout) == sorted(
        ["3g.40gb"] + ["1g.10gb"] * 7 + ["1g.10gb+me"]
    )


def test_more_mig_devices_than_the_gpus_hold_is_a_skip_reason() -> None:
    labels_ = {
        **whole("NVIDIA-A100-SXM4-80GB", 2, 81920, mig_capable=True),
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/mig-1g.10gb.count": "15",
    }
    with pytest.raises(NodeLabelsError, match="do not fit 2 GPU"):
        node_inventory(labels_)


@pytest.mark.parametrize(
    ("node_labels", "reason"),
    [
        ({"nvidia.com/gpu.product": "Tesla-T4"}, "no GPU labels"),
        ({"nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.count": "two"}, "not a count"),
        ({"nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.count": "0"}, "is 0"),
        (
            {
                "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-INVALID",
                "nvidia.com/gpu.count": "0",
            },
            "is 0",
        ),
        (
            {
                "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-INVALID",
                "nvidia.com/gpu.count": "1",
            },
            "single is invalid",
        ),
        (
            {
                "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
                "nvidia.com/gpu.count": "1",
                "nvidia.com/mig.strategy": "mixed",
                "nvidia.com/mig-1g.18gb.count": "1",
            },
            "not one of NVIDIA A100-SXM4-40GB's",
        ),
        (
            {
                "nvidia.com/gpu.product": "Tesla-T4",
                "nvidia.com/gpu.count": "1",
                "nvidia.com/gpu.replicas": "0",
                "nvidia.com/mig.strategy": "mixed",
            },
            "not a MIG-capable model",
        ),
    ],
)
def test_labels_that_do_not_describe_gpus_say_why(node_labels: dict[str, str], reason: str) -> None:
    with pytest.raises(NodeLabelsError, match=re.escape(reason)):
        node_inventory(node_labels)


ROUND_TRIP = [
    (preset, example)
    for preset in ("dgx-a100-80gb", "dgx-h100", "hgx-h200", "t4x4", "workstation")
    for example in ("reference-readme", "time-slicing", "mps", "per-gpu-replicas")
] + [("a100-mig-mixed", "mig-mixed")]


@pytest.mark.parametrize(("preset", "example"), ROUND_TRIP)
def test_a_node_labelled_by_this_plugin_plans_the_same_in_the_fleet_view(
    preset: str, example: str
) -> None:
    path = Path(__file__).resolve().parents[2] / "config" / "examples" / f"{example}.yaml"
    named = parse_configs(path.read_text(), file=str(path))
    config: Config = named[None].config
    inventory = discover(SimulatedNvml.from_preset(preset))
    try:
        planned = plan_node(config, inventory)
    except PlanError:
        pytest.skip("the config does not fit this preset")
    document = {
        "kind": "List",
        "items": [{"metadata": {"name": preset, "labels": labels(config, planned)}}],
    }
    (result,) = fleet_view(document, named).nodes
    assert result.status is NodeStatus.PLANNED, result
    want = {r.name: len(r.devices) for r in planned.plan.resources if r.devices}
    assert {r.name: r.devices for r in result.resources} == want


# --- MIG devices from labels, spread over the GPUs as the solver places them ------------------

# mig-parted's all-balanced on an A100-80GB, where `plan --gpus` has it.
BALANCED = ["2g.20gb@0", "1g.10gb@2", "1g.10gb@3", "3g.40gb@4"]


def advertised(resources: Any) -> dict[str, tuple[int, int]]:
    """{resource: (devices, physical devices)} of a plan's resources or a fleet node's."""
    out = {}
    for r in resources:
        if isinstance(r.devices, int):
            out[r.name] = (r.devices, r.physical)
        elif r.devices:
            out[r.name] = (len(r.devices), len({d.physical for d in r.devices}))
    return out


def gfd_mig(profile: str, count: int, memory: int, sm: int, slices: int) -> dict[str, str]:
    """GFD's labels of one MIG profile under the mixed strategy (its README's Generated Labels)."""
    key = f"nvidia.com/mig-{profile}"
    return {
        f"{key}.count": str(count),
        f"{key}.memory": str(memory),
        f"{key}.multiprocessors": str(sm),
        f"{key}.product": f"NVIDIA-A100-SXM4-80GB-MIG-{profile}",
        f"{key}.replicas": "1",
        f"{key}.sharing-strategy": "none",
        f"{key}.slices.ci": str(slices),
        f"{key}.slices.gi": str(slices),
    }


def test_a_node_in_mig_parteds_balanced_layout_is_planned_as_plan_gpus_plans_it() -> None:
    node_labels = {
        **whole("NVIDIA-A100-SXM4-80GB", 2, 81920, mig_capable=True),
        "nvidia.com/gpu.replicas": "0",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/mig.strategy": "mixed",
        **gfd_mig("3g.40gb", 2, 40192, 42, 3),
        **gfd_mig("2g.20gb", 2, 19968, 28, 2),
        **gfd_mig("1g.10gb", 4, 9728, 14, 1),
    }
    document = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": "a100-balanced", "labels": node_labels},
            }
        ],
    }
    named, _ = configs()
    (result,) = fleet_view(document, named, requested_name="mixed").nodes
    assert result.status is NodeStatus.PLANNED, result.reason
    assert result.gpus == "2x NVIDIA A100-SXM4-80GB (MIG on 2)"
    # `plan --gpus` on the same node: both GPUs as mig-parted left them.
    instances = {"enabled": True, "instances": BALANCED}
    node = simulated(
        "a100-balanced", [{"product": "NVIDIA A100-SXM4-80GB", "count": 2, "mig": instances}]
    )
    planned = plan_node(named["mixed"].config, discover(node))
    assert advertised(result.resources) == advertised(planned.plan.resources)
    assert advertised(result.resources)["nvidia.com/mig-1g.10gb"] == (8, 4)  # 2 replicas each
    layouts = [
        [f"{m.profile}@{m.placement.start}" for m in g.mig_devices]
        for g in node_inventory(node_labels).gpus
    ]
    assert layouts == [BALANCED, BALANCED]


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_every_gpu_node_of_a_mixed_fleet_is_planned_never_skipped(seed: int) -> None:
    fleet = mixed_fleet(random.Random(seed), 8)
    named = mixed_config()
    document, plans = labelled(fleet, named)
    view = fleet_view(document, named)
    for (name, gpus), result in zip(fleet, view.nodes, strict=True):
        if gpus is None:
            assert result.status is NodeStatus.SKIPPED
            continue
        assert result.status is NodeStatus.PLANNED, (gpus, result.reason, result.errors)
        got, want = advertised(result.resources), advertised(plans[name].plan.resources)
        mig = {k: v for k, v in want.items() if k.startswith("nvidia.com/mig-")}
        assert {k: v for k, v in got.items() if k.startswith("nvidia.com/mig-")} == mig
        all_or_none = len({bool(g.get("mig")) for g in gpus}) == 1
        if all_or_none:  # else labels cannot say how many GPUs are advertised whole
            assert got == want


def test_mig_gpus_rebuilt_from_labels_wait_for_no_mode_change() -> None:
    # As discovery reports a MIG GPU (current and pending mode on): turning MIG off is a plan,
    # not "pending a GPU reset", and the node then advertises its GPUs whole.
    off = parse_configs(
        "version: v1\nflags:\n  migStrategy: mixed\npartitioning:\n"
        "  mig:\n    - devices: all\n      enabled: false\n",
        file="off.yaml",
    )
    document = {
        "kind": "List",
        "items": [{"metadata": {"name": "m", "labels": KINDS["mig-mixed"]}}],
    }
    (result,) = fleet_view(document, off).nodes
    assert result.status is NodeStatus.PLANNED, result.errors
    assert advertised(result.resources) == {"nvidia.com/gpu": (2, 2)}
    assert not [line for line in result.mig if "pending" in line or "reset" in line]
    assert [line for line in result.mig if line.strip() == "disable MIG mode"] == [
        "  disable MIG mode"
    ] * 2


def test_dra_counts_follow_the_configs_shared_devices() -> None:
    text = (
        "version: v1\n{dra}sharing:\n  timeSlicing:\n    resources:\n"
        "      - name: nvidia.com/gpu\n        replicas: 4\n"
    )
    node = {"metadata": {"name": "t4-0", "labels": KINDS["t4"]}}
    for dra, devices in (("", 4), ("dra:\n  sharedDevices: replicas\n", 16)):
        named = parse_configs(text.format(dra=dra), file="c.yaml")
        (result,) = fleet_view({"kind": "List", "items": [node]}, named).nodes
        (resource,) = result.resources
        assert (resource.devices, resource.physical) == (16, 4)
        assert (resource.dra_devices, resource.dra_claims) == (devices, 16)


def test_dra_counts_of_a_dynamic_gpu_are_its_placements() -> None:
    labels = {
        k.replace("1g.10gb", "3g.40gb"): v for k, v in KINDS["mig-mixed"].items()
    }  # 2 x A100-80GB, a 3g.40gb instance on each
    labels.update({"nvidia.com/mig-3g.40gb.count": "2", "nvidia.com/mig-3g.40gb.memory": "40192"})
    text = (
        "version: v1\nflags:\n  migStrategy: mixed\npartitioning:\n  mig:\n"
        "    - devices: all\n      dynamic: true\n"
    )
    node = {"metadata": {"name": "a100-0", "labels": labels}}
    (result,) = fleet_view({"kind": "List", "items": [node]}, parse_configs(text, file="c")).nodes
    (resource,) = result.resources
    assert (resource.name, resource.devices) == ("nvidia.com/mig-3g.40gb", 2)
    # run-dra publishes every 3g.40gb placement (starts 0 and 4 on each GPU), two fit a GPU.
    assert (resource.dra_devices, resource.dra_claims) == (4, 4)
