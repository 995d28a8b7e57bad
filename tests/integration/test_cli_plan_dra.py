"""`plan --format dra`: the DeviceClasses and ResourceSlices run-dra would publish, as YAML."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml_fast

from sharing_plugin.cli import main
from sharing_plugin.config.selection import select
from sharing_plugin.nvml.discover import discover
from sharing_plugin.plan.node import plan_node
from sharing_plugin.sim.nvml.node import preset_names
from sharing_plugin.sim.nvml.simulated import SimulatedNvml
from sharing_plugin.sources.files import load_configs
from sharing_plugin.views.dra import dra_documents

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "config" / "examples" / "time-slicing.yaml"
EXAMPLES = sorted((ROOT / "config" / "examples").glob("*.yaml"))

# What the API server's validation asks of each name (RFC 1123; apimachinery's
# IsDNS1123Subdomain / IsDNS1123Label, resource.k8s.io's attribute and capacity names).
LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
SUBDOMAIN = re.compile(rf"{LABEL.pattern}(\.{LABEL.pattern})*")
C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def subdomain(name: str) -> bool:
    return len(name) <= 253 and SUBDOMAIN.fullmatch(name) is not None


def label(name: str) -> bool:
    return len(name) <= 63 and LABEL.fullmatch(name) is not None


def bad_names(document: dict[str, Any]) -> list[str]:
    """Every name of a printed DeviceClass or ResourceSlice the API server would refuse."""
    bad = [f"metadata.name {document['metadata']['name']!r}"]
    if not subdomain(document["metadata"]["name"]):
        return bad
    bad = []
    if document["kind"] == "ResourceSlice":
        spec = document["spec"]
        if not (subdomain(spec["driver"]) and len(spec["driver"]) <= 63):
            bad.append(f"driver {spec['driver']!r}")
        for where in ("nodeName", "pool"):
            value = spec[where] if where == "nodeName" else spec["pool"]["name"]
            if not subdomain(value):
                bad.append(f"{where} {value!r}")
        for counter_set in spec.get("sharedCounters") or ():  # dynamic MIG's own slices
            for name in (counter_set["name"], *counter_set["counters"]):
                if not label(name):
                    bad.append(f"counter set or counter {name!r}")
        for device in spec.get("devices") or ():
            if not label(device["name"]):
                bad.append(f"device {device['name']!r}")
            for key in (*device["attributes"], *device["capacity"]):
                # A qualified name: an optional domain (a subdomain of at most 63 characters,
                # `resource.kubernetes.io` for the standard ones), then a C identifier.
                domain, _, name = key.rpartition("/")
                bad_domain = bool(domain) and (len(domain) > 63 or not subdomain(domain))
                if bad_domain or len(name) > 32 or not C_IDENTIFIER.fullmatch(name):
                    bad.append(f"{device['name']}: attribute or capacity {key!r}")
    return bad


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
    # By capacity, as the config does not say otherwise: one device per physical device.
    assert sum(len(s["spec"]["devices"]) for s in slices) == len(
        {(r.name, d.physical) for r in node.plan.resources for d in r.devices}
    )


def test_dra_format_is_about_one_node(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = tmp_path / "nodes.json"
    nodes.write_text('{"kind": "List", "items": []}')
    assert main(["plan", "--config", str(EXAMPLE), "--nodes", str(nodes), "--format", "dra"]) == 2
    assert "--format dra is about one node" in capsys.readouterr().err


@pytest.mark.parametrize("preset", preset_names())
def test_every_name_printed_is_one_the_api_server_accepts(
    preset: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    printed = 0
    for example in EXAMPLES:
        args = ["plan", "--config", str(example), "--gpus", f"simulated:{preset}"]
        if main([*args, "--format", "dra"]) != 0:
            continue  # does not fit this preset (test_cli_plan.py knows which)
        documents = list(yaml_fast.load_all(capsys.readouterr().out))
        slices = [d for d in documents if d["kind"] == "ResourceSlice"]
        assert slices, example.name
        assert {(s["spec"]["nodeName"], s["spec"]["pool"]["name"]) for s in slices} == {
            ("example-node", "example-node")
        }
        assert [b for d in documents for b in bad_names(d)] == [], example.name
        printed += 1
    capsys.readouterr()
    assert printed


def test_node_name_from_the_environment_as_run_dra_reads_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NODE_NAME", "gpu-node-3.zone-a")
    args = ["plan", "--config", str(EXAMPLE), "--gpus", "simulated:t4x4", "--format", "dra"]
    assert main(args) == 0
    slices = [
        d for d in yaml_fast.load_all(capsys.readouterr().out) if d["kind"] == "ResourceSlice"
    ]
    assert {s["spec"]["pool"]["name"] for s in slices} == {"gpu-node-3.zone-a"}
    assert main([*args, "--node-name", "gpu-node-4"]) == 0  # the flag wins
    slices = [
        d for d in yaml_fast.load_all(capsys.readouterr().out) if d["kind"] == "ResourceSlice"
    ]
    assert {s["spec"]["nodeName"] for s in slices} == {"gpu-node-4"}


@pytest.mark.parametrize("name", ["NODE", "", "node_1", "-node", "node.", "a" * 254])
def test_a_node_name_the_api_server_refuses_is_a_usage_error(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["plan", "--config", str(EXAMPLE), "--gpus", "simulated:t4x4", "--format", "dra"]
    assert main([*args, f"--node-name={name}"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("sharing-plugin plan: --node-name (NODE_NAME) must be a node's name")
    assert repr(name) in err
    # Other formats do not use the name.
    assert main([*args[:-1], "table", f"--node-name={name}"]) == 0
