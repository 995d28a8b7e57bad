"""The attributes NVIDIA's tools read, on every device the pool can publish: their values,
their types, and the API's limit of 32 attributes and capacities per device."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sharing_plugin.config.loader import parse_config
from sharing_plugin.errors import ConfigError
from sharing_plugin.gpus.catalog import MODELS, architecture_of
from sharing_plugin.nvml.discover import discover
from sharing_plugin.nvml.identity import SysfsPcieRoots
from sharing_plugin.plan.node import plan_node
from sharing_plugin.sim.nvml.node import load_node_file, preset_names
from sharing_plugin.sim.nvml.simulated import SimulatedNvml
from sharing_plugin.views.dra import dra_documents
from sharing_plugin.views.dra_attributes import (
    MAX_ATTRIBUTES_AND_CAPACITIES,
    cuda_version,
    semver,
)

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "config" / "examples").glob("*.yaml"))
SEMVER = r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"  # what the API server parses, strictly


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("550.54.15", "550.54.15"),
        ("535.104.05", "535.104.5"),  # no leading zeros in semver 2.0
        ("615.25.01", "615.25.1"),
        ("560.35", "560.35.0"),
        ("9.0", "9.0.0"),
        ("", None),
        ("550.54.15-beta", None),
        ("1.2.3.4", None),
    ],
)
def test_versions_are_semver_without_leading_zeros(text: str, version: str | None) -> None:
    assert semver(text) == version


@given(st.lists(st.integers(0, 99_999), min_size=1, max_size=3))
def test_any_dotted_number_becomes_a_strict_semver(parts: list[int]) -> None:
    padded = ".".join(f"{p:03d}" for p in parts)
    found = semver(padded)
    assert found is not None
    assert re.fullmatch(SEMVER, found)
    assert [int(p) for p in found.split(".")][: len(parts)] == parts


def test_cuda_driver_version_is_major_minor() -> None:
    assert cuda_version(12040) == "12.4.0"
    assert cuda_version(13000) == "13.0.0"
    assert cuda_version(0) is None


def test_every_catalogued_model_has_an_architecture() -> None:
    for model in MODELS:
        assert architecture_of(model.compute_capability), model.display_name
    assert architecture_of((8, 9)) == "Ada Lovelace"
    assert architecture_of((7, 5)) == "Turing"
    assert architecture_of((9, 0)) == "Hopper"
    assert architecture_of((2, 0)) == ""


def published_devices(config_text: str, preset: str) -> list[dict[str, Any]]:
    config = parse_config(config_text, file="config.yaml").config
    node_plan = plan_node(config, discover(SimulatedNvml.from_preset(preset)), as_is=True)
    documents = dra_documents(config, node_plan, "node-1")
    return [
        d for s in documents if s["kind"] == "ResourceSlice" for d in s["spec"].get("devices") or ()
    ]


LARGEST = {
    # A MIG placement of a dynamic GPU (GPU 3: MIG on, no instances): migProfile, profile,
    # parentUUID and migStart.
    "placement": (
        "partitioning:\n  mig:\n    - {devices: [3], dynamic: true}\n",
        "a100-mig-mixed",
    ),
    # A MIG device shared by capacity: a request policy on its memory.
    "shared MIG": (
        "flags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    resources:\n"
        "      - {name: nvidia.com/mig-1g.10gb, replicas: 4}\n",
        "a100-mig-mixed",
    ),
    # A MIG replica: the replica number besides the MIG attributes.
    "MIG replica": (
        "flags: {migStrategy: mixed}\ndra: {sharedDevices: replicas}\nsharing:\n"
        "  timeSlicing:\n    resources:\n      - {name: nvidia.com/mig-1g.10gb, replicas: 4}\n",
        "a100-mig-mixed",
    ),
}


@pytest.mark.parametrize("shape", sorted(LARGEST))
def test_the_largest_devices_stay_within_the_api_limit(shape: str) -> None:
    devices = published_devices(*LARGEST[shape])
    assert devices
    for device in devices:
        attributes = device["attributes"]
        assert len(attributes) + len(device["capacity"]) <= MAX_ATTRIBUTES_AND_CAPACITIES
        assert attributes["type"] == {"string": "mig"} or "profile" not in attributes
        if "migProfile" in attributes:
            assert attributes["profile"] == attributes["migProfile"]
            assert attributes["parentUUID"]["string"].startswith("GPU-")
        for name in ("cudaComputeCapability", "driverVersion", "cudaDriverVersion"):
            assert re.fullmatch(SEMVER, attributes[name]["version"])


def test_every_example_on_every_preset_stays_within_the_api_limit() -> None:
    counted = 0
    for preset in preset_names():
        for example in EXAMPLES:
            try:
                devices = published_devices(example.read_text(), preset)
            except Exception:
                continue
            for device in devices:
                size = len(device["attributes"]) + len(device["capacity"])
                assert size <= MAX_ATTRIBUTES_AND_CAPACITIES, (preset, example.name, device)
                counted += 1
    assert counted > 300


def test_a_gpu_says_what_nvidia_s_driver_says_of_it() -> None:
    (device, *_) = published_devices("version: v1\n", "dgx-h100")
    attributes = device["attributes"]
    assert {k: v for k, v in attributes.items() if k not in ("uuid",)} == {
        "type": {"string": "gpu"},
        "resource": {"string": "nvidia.com/gpu"},
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": "Hopper"},
        "cudaComputeCapability": {"version": "9.0.0"},
        "driverVersion": {"version": "550.54.15"},
        "cudaDriverVersion": {"version": "12.4.0"},
        "pcieBusID": {"string": "0000:1b:00.0"},
        "resource.kubernetes.io/pciBusID": {"string": "0000:1b:00.0"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:15"},
        "resource.kubernetes.io/numaNode": {"int": 0},
        "sharing": {"string": "none"},
        "index": {"int": 0},
    }


def test_the_root_complex_is_read_from_sysfs(tmp_path: Path) -> None:
    """As the kernel lays sysfs out: the bus's device entry links into the device tree, whose
    first directory is the root complex."""
    gpu = tmp_path / "devices" / "pci0000:40" / "0000:40:01.1" / "0000:47:00.0"
    gpu.mkdir(parents=True)
    bus = tmp_path / "bus" / "pci" / "devices"
    bus.mkdir(parents=True)
    (bus / "0000:47:00.0").symlink_to(os.path.relpath(gpu, bus))
    roots = SysfsPcieRoots(tmp_path)
    assert roots.pcie_root("0000:47:00.0") == "pci0000:40"
    assert roots.pcie_root("0000:48:00.0") is None  # no such device
    assert roots.pcie_root("00000000:47:00.0") is None  # NVML's form is converted first
    assert SysfsPcieRoots(tmp_path / "absent").pcie_root("0000:47:00.0") is None


def test_a_node_file_places_gpus_on_buses_and_root_complexes(tmp_path: Path) -> None:
    node = tmp_path / "node.yaml"
    node.write_text(
        "gpus:\n  - product: Tesla T4\n    count: 2\n"
        '    pciBusIds: ["0000:3b:00.0", "00000000:5E:00.0"]\n    pcieRoot: pci0000:3a\n'
    )
    inventory = discover(SimulatedNvml(load_node_file(node)))
    assert [g.pci_bus_id for g in inventory.gpus] == ["00000000:3B:00.0", "00000000:5E:00.0"]
    assert {g.pcie_root for g in inventory.gpus} == {"pci0000:3a"}
    assert {(g.architecture, g.brand) for g in inventory.gpus} == {("Turing", "Nvidia")}


@pytest.mark.parametrize(
    ("group", "message"),
    [
        ('count: 2, pciBusIds: ["0000:3b:00.0"]', "lists 1 bus IDs for 2 GPU(s)"),
        ('pciBusIds: ["3b:00.0"]', "'3b:00.0' is not a PCI bus ID"),
        ("pcieRoot: root0", "should match pattern"),
    ],
)
def test_a_wrong_placement_is_a_precise_error(tmp_path: Path, group: str, message: str) -> None:
    node = tmp_path / "node.yaml"
    node.write_text(f"gpus: [{{product: Tesla T4, {group}}}]\n")
    with pytest.raises(ConfigError) as caught:
        load_node_file(node)
    assert message in caught.value.problems[0].message
    assert caught.value.problems[0].path.startswith("gpus[0]")
