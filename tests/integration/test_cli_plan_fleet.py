"""`sharing-plugin plan --format labels` (one node's labels) and `plan --nodes` (the fleet view)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from sharing_plugin.backends import backend_from_spec
from sharing_plugin.cli import main
from sharing_plugin.config.loader import parse_configs
from sharing_plugin.nvml.discover import discover
from sharing_plugin.plan.node import plan_node
from sharing_plugin.views.labels import labels

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "config" / "examples"
LABEL = "nvidia.com/device-plugin.config"

CONFIGMAP = """\
apiVersion: v1
kind: ConfigMap
metadata: {name: plugin}
data:
  default: |
    version: v1
  ts-4: |
    version: v1
    sharing:
      timeSlicing:
        resources:
          - name: nvidia.com/gpu
            rename: gpu.ts
            replicas: 4
  pinned: |
    version: v1
    sharing:
      timeSlicing:
        resources:
          - name: gpu
            devices: [0, 1, 2, 3]
            replicas: 2
"""


def gpu_node(name: str, product: str, count: int, **extra: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"nvidia.com/gpu.product": product, "nvidia.com/gpu.count": str(count)}
            | extra,
        },
    }


def cluster() -> dict[str, Any]:
    """What `kubectl get nodes -o json` prints for: an A100 node on `ts-4`, a T4 node on the
    default config, a node whose two T4s `pinned` does not fit, and a node without GPU labels."""
    return {
        "apiVersion": "v1",
        "kind": "List",
        "metadata": {"resourceVersion": ""},
        "items": [
            gpu_node("a100-1", "NVIDIA-A100-SXM4-80GB", 8, **{LABEL: "ts-4"}),
            gpu_node("t4-1", "Tesla-T4", 4),
            gpu_node("t4-small", "Tesla-T4", 2, **{LABEL: "pinned"}),
            {
                "kind": "Node",
                "metadata": {"name": "cpu-1", "labels": {"kubernetes.io/os": "linux"}},
            },
        ],
    }


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    config = tmp_path / "cm.yaml"
    config.write_text(CONFIGMAP)
    nodes = tmp_path / "nodes.json"
    nodes.write_text(json.dumps(cluster()))
    return config, nodes


# -- plan --format labels ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("example", "preset"),
    [
        ("time-slicing.yaml", "t4x4"),
        ("mig-mixed.yaml", "a100-mig-mixed"),
        ("mig-partitioning.yaml", "dgx-a100-80gb"),
    ],
)
def test_labels_are_the_sorted_lines_of_the_labels_function(
    example: str, preset: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = EXAMPLES / example
    args = ["plan", "--config", str(path), "--gpus", f"simulated:{preset}", "--format", "labels"]
    assert main(args) == 0
    out = capsys.readouterr().out
    # The same function the daemon publishes with, on the node as planned.
    (loaded,) = parse_configs(path.read_bytes(), file=str(path)).values()
    inventory = discover(backend_from_spec(f"simulated:{preset}"))
    expected = labels(loaded.config, plan_node(loaded.config, inventory))
    assert expected and out == "".join(f"{k}={expected[k]}\n" for k in sorted(expected))
    lines = out.splitlines()
    assert lines == sorted(lines)
    assert all("=" in line for line in lines)


def test_labels_of_a_shared_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "sharing:\n  timeSlicing:\n    resources: [{name: nvidia.com/gpu, replicas: 4}]\n"
    )
    assert (
        main(["plan", "--config", str(config), "--gpus", "simulated:t4x4", "--format", "labels"])
        == 0
    )
    out, err = capsys.readouterr()
    got = dict(line.split("=", 1) for line in out.splitlines())
    assert got["nvidia.com/gpu.product"] == "Tesla-T4-SHARED"
    assert got["nvidia.com/gpu.replicas"] == "4"
    assert got["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert got["nvidia.com/gpu.count"] == "4"
    assert err == ""


def test_labels_of_a_config_that_does_not_fit_write_nothing_to_stdout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "sharing:\n  timeSlicing:\n    resources: [{name: gpu, devices: [7], replicas: 2}]\n"
    )
    args = ["plan", "--config", str(config), "--gpus", "simulated:t4x4", "--format", "labels"]
    assert main(args) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"{config}:3:39: sharing.timeSlicing.resources[0].devices[0]: GPU 7")
    config.write_text("flags:\n  migStrategy: sometimes\n")
    assert main(args) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"{config}:2:16: flags.migStrategy: unknown value")


def test_labels_with_nodes_is_a_usage_error(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    config, nodes = files
    assert main(["plan", "--config", str(config), "--nodes", str(nodes), "--format", "labels"]) == 2
    assert "--format labels" in capsys.readouterr().err


# -- --gpus or --nodes ------------------------------------------------------------------------


def test_exactly_one_of_gpus_and_nodes(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    config, nodes = files
    assert main(["plan", "--config", str(config)]) == 2
    assert "one of the arguments --gpus --nodes is required" in capsys.readouterr().err
    both = ["--gpus", "simulated:t4x4", "--nodes", str(nodes)]
    assert main(["plan", "--config", str(config), *both]) == 2
    assert "not allowed with argument" in capsys.readouterr().err


# -- plan --nodes -----------------------------------------------------------------------------


def test_fleet_json(files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    config, nodes = files
    args = ["plan", "--config", str(config), "--nodes", str(nodes), "--format", "json"]
    assert main(args) == 1  # t4-small's config does not fit it
    out, err = capsys.readouterr()
    doc = json.loads(out)
    by_name = {n["name"]: n for n in doc["nodes"]}
    assert [n["name"] for n in doc["nodes"]] == ["a100-1", "t4-1", "t4-small", "cpu-1"]
    assert {n: by_name[n]["status"] for n in by_name} == {
        "a100-1": "planned",
        "t4-1": "planned",
        "t4-small": "error",
        "cpu-1": "skipped",
    }
    a100 = by_name["a100-1"]
    assert a100["config"] == "ts-4"
    # By capacity in DRA mode: one device per GPU, on which 32 claims asking nothing fit.
    assert a100["resources"] == [
        {
            "name": "nvidia.com/gpu.ts",
            "devices": 32,
            "physical": 8,
            "sharing": "time-slicing",
            "dra": {"devices": 8, "claims": 32},
        }
    ]
    assert by_name["t4-1"]["config"] == "default"
    assert by_name["t4-1"]["resources"] == [
        {
            "name": "nvidia.com/gpu",
            "devices": 4,
            "physical": 4,
            "sharing": "none",
            "dra": {"devices": 4, "claims": 4},
        }
    ]
    # GPUs 2 and 3 are not there, each at its entry in the manifest, as `plan --gpus` says.
    assert by_name["t4-small"]["errors"] == [
        f"{config}:21:{column}: data.pinned: sharing.timeSlicing.resources[0].devices[{i}]: "
        f"GPU {i} does not exist on this node: it has GPU 0, 1"
        for i, column in ((2, 29), (3, 32))
    ]
    assert by_name["cpu-1"]["reason"]
    assert doc["totals"] == {
        "nodes": {"total": 4, "planned": 2, "error": 1, "skipped": 1},
        "resources": [
            {
                "name": "nvidia.com/gpu",
                "devices": 4,
                "physical": 4,
                "nodes": 1,
                "dra": {"devices": 4, "claims": 4},
            },
            {
                "name": "nvidia.com/gpu.ts",
                "devices": 32,
                "physical": 8,
                "nodes": 1,
                "dra": {"devices": 8, "claims": 32},
            },
        ],
    }
    # The configs' notes on stderr, as validate prints them; stdout stays JSON.
    assert [line.split(": honoured here")[0] for line in err.splitlines()] == [
        f"info: {config}: data.ts-4: sharing.timeSlicing.resources[0].rename",
        f"info: {config}: data.pinned: sharing.timeSlicing.resources[0].devices",
    ]


def test_fleet_table_and_exit_0_when_every_node_fits(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    config, nodes = files
    document = cluster()
    document["items"] = [n for n in document["items"] if n["metadata"]["name"] != "t4-small"]
    nodes.write_text(json.dumps(document))
    assert main(["plan", "--config", str(config), "--nodes", str(nodes)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["NODE", "CONFIG", "GPUS", "RESOURCES"]
    assert "a100-1" in out and "nvidia.com/gpu.ts: 32 (8 physical)" in out
    assert "cluster total (3 nodes: 2 planned, 0 error, 1 skipped)" in out


def test_fleet_from_stdin_with_a_requested_name(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config, _ = files
    document = {"kind": "List", "items": [gpu_node("t4-1", "Tesla-T4", 4)]}
    stdin = io.TextIOWrapper(io.BytesIO(json.dumps(document).encode()))
    monkeypatch.setattr("sys.stdin", stdin)
    args = ["plan", "--config", str(config), "--nodes", "-", "--config-name", "ts-4"]
    assert main([*args, "--format", "json"]) == 0
    (node,) = json.loads(capsys.readouterr().out)["nodes"]
    assert node["config"] == "ts-4"
    assert node["resources"][0]["devices"] == 16


def test_fleet_with_a_plain_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = tmp_path / "nodes.json"
    nodes.write_text(json.dumps(cluster()))
    example = EXAMPLES / "time-slicing.yaml"
    assert main(["plan", "--config", str(example), "--nodes", str(nodes), "--format", "json"]) in (
        0,
        1,
    )
    doc = json.loads(capsys.readouterr().out)
    assert all(n["config"] is None for n in doc["nodes"] if n["status"] != "skipped")


def test_fleet_input_errors(
    files: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, nodes = files
    missing = tmp_path / "none.json"
    assert main(["plan", "--config", str(config), "--nodes", str(missing)]) == 2
    assert capsys.readouterr().err == (
        f"sharing-plugin plan: {missing}: no such file or directory\n"
    )
    nodes.write_text("items:\n  - kind: Node\n")
    assert main(["plan", "--config", str(config), "--nodes", str(nodes)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"sharing-plugin plan: {nodes}: not JSON: ")
    nodes.write_text('{"kind": "Pod"}')
    assert main(["plan", "--config", str(config), "--nodes", str(nodes)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"sharing-plugin plan: {nodes}: not a list of nodes")
    bad = tmp_path / "bad.yaml"
    bad.write_text("flags:\n  migStrategy: sometimes\n")
    nodes.write_text(json.dumps(cluster()))
    assert main(["plan", "--config", str(bad), "--nodes", str(nodes), "--format", "json"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"{bad}:2:16: flags.migStrategy")
    assert main(["plan", "--config", str(tmp_path / "x.yaml"), "--nodes", str(nodes)]) == 2


BALANCED_LAYOUT = """\
version: v1
flags:
  migStrategy: mixed
partitioning:
  mig:
    - devices: all
      profiles: {3g.40gb: 1, 2g.20gb: 1, 1g.10gb: 2}
"""


def test_a_declared_layout_plans_alike_from_the_node_and_from_its_labels(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Two A100-80GB laid out as mig-parted's all-balanced: their labels count 2 x 3g.40gb,
    # 2 x 2g.20gb and 4 x 1g.10gb, and the fleet view must spread them as `plan --gpus` places
    # the declared layout, so planning the same config from the labels has nothing to change.
    node = tmp_path / "node.yaml"
    node.write_text(
        "gpus:\n  - product: NVIDIA A100-SXM4-80GB\n    count: 2\n    mig: {enabled: true}\n"
    )
    config = tmp_path / "balanced.yaml"
    config.write_text(BALANCED_LAYOUT)
    one_node = ["plan", "--config", str(config), "--gpus", f"simulated:{node}"]
    assert main([*one_node, "--format", "json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    desired = [gpu["desired"] for gpu in planned["mig"]]
    assert desired == [["2g.20gb@0", "1g.10gb@2", "1g.10gb@3", "3g.40gb@4"]] * 2
    assert main([*one_node, "--format", "labels"]) == 0
    node_labels = dict(line.split("=", 1) for line in capsys.readouterr().out.splitlines())
    assert node_labels["nvidia.com/mig-1g.10gb.count"] == "4"
    nodes = tmp_path / "nodes.json"
    item = {"kind": "Node", "metadata": {"name": "a100-balanced", "labels": node_labels}}
    nodes.write_text(json.dumps({"kind": "List", "items": [item]}))
    assert main(["plan", "--config", str(config), "--nodes", str(nodes), "--format", "json"]) == 0
    (result,) = json.loads(capsys.readouterr().out)["nodes"]
    assert result["status"] == "planned", result["reason"]
    assert result["gpus"] == "2x NVIDIA A100-SXM4-80GB (MIG on 2)"
    assert result["resources"] == [
        {
            "name": r["name"],
            "devices": len(r["devices"]),
            "physical": len(r["devices"]),
            "sharing": r["sharing"],
            "dra": {"devices": len(r["devices"]), "claims": len(r["devices"])},
        }
        for r in planned["resources"]
    ]
    # Each GPU already holds the declared layout where the solver puts it: nothing to create.
    assert result["mig"] == [
        f"GPU {i} (NVIDIA A100-SXM4-80GB): 2g.20gb@0 1g.10gb@2 1g.10gb@3 3g.40gb@4 -> "
        "2g.20gb@0 1g.10gb@2 1g.10gb@3 3g.40gb@4"
        for i in (0, 1)
    ]
