"""`plan --format dra`: the DeviceClasses and ResourceSlices run-dra would publish, as YAML."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml_fast

from sharing_plugin.cli import main
from sharing_plugin.config.loader import select
from sharing_plugin.nvml.discover import discover
from sharing_plugin.plan.node import plan_node
from sharing_plugin.sim.nvml.simulated import SimulatedNvml
from sharing_plugin.sources.files import load_configs
from sharing_plugin.views.dra import dra_documents

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "config" / "examples" / "time-slicing.yaml"


def test_dra_format_prints_what_run_dra_publishes(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "--config", str(EXAMPLE), "--gpus", "simulated:t4x4", "--format", "dra"]
    assert main([*args, "--node-name", "gpu-7"]) == 0
    printed = list(yaml_fast.load_all(capsys.readouterr().out))
    _, loaded = select(load_configs(EXAMPLE), None, None)
    node = plan_node(loaded.config, discover(SimulatedNvml.from_preset("t4x4")))
    assert printed == dra_documents(loaded.config, node, "gpu-7", "gpu.sharing-plugin.io")
    kinds = {d["kind"] for d in printed}
    assert kinds == {"DeviceClass", "ResourceSlice"}
    slices = [d for d in printed if d["kind"] == "ResourceSlice"]
    assert all(s["spec"]["nodeName"] == "gpu-7" for s in slices)
    assert sum(len(s["spec"]["devices"]) for s in slices) == sum(
        len(r.devices) for r in node.plan.resources
    )


def test_dra_format_is_about_one_node(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = tmp_path / "nodes.json"
    nodes.write_text('{"kind": "List", "items": []}')
    assert main(["plan", "--config", str(EXAMPLE), "--nodes", str(nodes), "--format", "dra"]) == 2
    assert "--format dra is about one node" in capsys.readouterr().err
