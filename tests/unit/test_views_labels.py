"""Node labels from the plan, held to what gpu-feature-discovery documents it publishes.

Expectations are written from GFD's documentation, not from the code under test: the GFD
README's "Generated Labels" (gpu.product/count/memory/family/compute, the MIG single
strategy's overridden gpu.* labels, the mixed strategy's per-profile labels), the
k8s-device-plugin README and GPU Operator "time-slicing" / "MPS" pages (gpu.replicas,
gpu.sharing-strategy, the -SHARED suffix only when the resource is not renamed, count = the
physical GPUs), and GFD's labeler (mig.strategy absent under none, mps.capable, replicas 0 for
GPUs only advertised as MIG devices, a MIG profile's `+` written `.`). Values that come from the
GPU itself (memory in MiB, compute capability) are what the simulated NVML reports for each
preset, as NVML would.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from sharing_plugin.config.loader import parse_config
from sharing_plugin.config.model import Config
from sharing_plugin.errors import PlanError
from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.nvml.discover import discover
from sharing_plugin.plan.node import plan_node
from sharing_plugin.sim.nvml.simulated import SimulatedNvml
from sharing_plugin.views.labels import gfd_label_value, labels, labels_for, owns, render_labels

EXAMPLES = Path(__file__).resolve().parents[2] / "config" / "examples"
PRESETS = ("a100-mig-mixed", "dgx-a100-80gb", "dgx-h100", "hgx-h200", "t4x4", "workstation")
_NODES: dict[str, Inventory] = {}


def node(preset: str) -> Inventory:
    if preset not in _NODES:
        _NODES[preset] = discover(SimulatedNvml.from_preset(preset))
    return _NODES[preset]


def example(name: str) -> Config:
    path = EXAMPLES / f"{name}.yaml"
    return parse_config(path.read_text(), file=str(path)).config


def config(**sections: Any) -> Config:
    return Config.model_validate({"version": "v1", **sections})


# What NVML reports for each preset's whole GPUs under migStrategy none (GFD labels the model
# with the most GPUs; a100-mig-mixed has 4 A100-80GB and 2 A100-40GB).
# preset: (gpu.product, gpu.count, gpu.memory, family, compute major, minor, mig.capable,
#          any GPU with MIG enabled)
FACTS: dict[str, tuple[str, int, int, str, int, int, bool, bool]] = {
    "a100-mig-mixed": ("NVIDIA-A100-SXM4-80GB", 4, 81920, "ampere", 8, 0, True, True),
    "dgx-a100-80gb": ("NVIDIA-A100-SXM4-80GB", 8, 81920, "ampere", 8, 0, True, False),
    "dgx-h100": ("NVIDIA-H100-80GB-HBM3", 8, 81559, "hopper", 9, 0, True, False),
    "hgx-h200": ("NVIDIA-H200", 8, 143771, "hopper", 9, 0, True, False),
    "t4x4": ("Tesla-T4", 4, 15360, "turing", 7, 5, False, False),
    "workstation": ("NVIDIA-L4", 1, 23034, "ada-lovelace", 8, 9, False, False),
}


def gpu_labels(
    preset: str,
    *,
    replicas: int = 1,
    strategy: str = "none",
    suffix: str = "",
    mps: bool = False,
    mig_strategy: str | None = None,
) -> dict[str, str]:
    product, count, memory, family, major, minor, mig_capable, mig_on = FACTS[preset]
    out = {
        "nvidia.com/gpu.product": product + suffix,
        "nvidia.com/gpu.count": str(count),
        "nvidia.com/gpu.memory": str(memory),
        "nvidia.com/gpu.replicas": str(replicas),
        "nvidia.com/gpu.sharing-strategy": strategy,
        "nvidia.com/gpu.family": family,
        "nvidia.com/gpu.compute.major": str(major),
        "nvidia.com/gpu.compute.minor": str(minor),
        "nvidia.com/mig.capable": "true" if mig_capable else "false",
        "nvidia.com/mps.capable": "true" if mps and not mig_on else "false",
    }
    if mig_strategy is not None:
        out["nvidia.com/mig.strategy"] = mig_strategy
    return out


def mig_labels(
    profile: str,
    *,
    product: str,
    count: int,
    memory: int,
    sms: int,
    replicas: int = 1,
    strategy: str = "none",
    suffix: str = "",
) -> dict[str, str]:
    name = f"nvidia.com/mig-{profile}"
    slices = profile.split("g.")[0]
    return {
        f"{name}.product": f"{product}-MIG-{profile}{suffix}",
        f"{name}.count": str(count),
        f"{name}.memory": str(memory),
        f"{name}.replicas": str(replicas),
        f"{name}.sharing-strategy": strategy,
        f"{name}.multiprocessors": str(sms),
        f"{name}.slices.gi": slices,
        f"{name}.slices.ci": slices,
    }


A100_80 = "NVIDIA-A100-SXM4-80GB"
A100_40 = "NVIDIA-A100-SXM4-40GB"
H100 = "NVIDIA-H100-80GB-HBM3"

# Four GPUs cut as 1g.10gb x3 + 2g.20gb x2, two as 3g.40gb x2, two left whole.
PARTITIONED = {
    "dgx-a100-80gb": {
        **mig_labels("1g.10gb", product=A100_80, count=12, memory=9728, sms=14),
        **mig_labels("2g.20gb", product=A100_80, count=8, memory=19968, sms=28),
        **mig_labels("3g.40gb", product=A100_80, count=4, memory=40192, sms=42),
    },
    "dgx-h100": {
        **mig_labels("1g.10gb", product=H100, count=12, memory=9984, sms=16),
        **mig_labels("2g.20gb", product=H100, count=8, memory=20096, sms=32),
        **mig_labels("3g.40gb", product=H100, count=4, memory=40448, sms=60),
    },
}


def expected(example_name: str, preset: str) -> dict[str, str] | None:
    """What GFD's documentation says the node is labelled with; None: the config does not fit."""
    product, count, memory, *_ = FACTS[preset]
    if example_name in ("reference-readme", "reference-health"):
        shared = example_name == "reference-health"  # timeSlicing gpu x2, not renamed
        return gpu_labels(
            preset,
            replicas=2 if shared else 1,
            strategy="time-slicing" if shared else "none",
            suffix="-SHARED" if shared else "",
        )
    # renameByDefault: replicas as nvidia.com/gpu.shared (usage: the same sharing, judged)
    if example_name in ("time-slicing", "usage"):
        physical = 6 if preset == "a100-mig-mixed" else count
        return {
            **gpu_labels(preset, replicas=4, strategy="time-slicing"),
            # The plugin's own labels for the renamed resource (module docstring).
            "nvidia.com/gpu.shared.product": product,
            "nvidia.com/gpu.shared.count": str(physical),
            "nvidia.com/gpu.shared.memory": str(memory),
            "nvidia.com/gpu.shared.replicas": "4",
            "nvidia.com/gpu.shared.sharing-strategy": "time-slicing",
        }
    if example_name == "mps":
        return gpu_labels(preset, replicas=4, strategy="mps", suffix="-SHARED", mps=True)
    if example_name == "mps-memory":  # memoryPerReplica 10Gi, renamed gpu-10gb
        replicas = memory // 10240
        strategy = "mps" if replicas > 1 else "none"
        return {
            **gpu_labels(preset, replicas=replicas, strategy=strategy, mps=True),
            "nvidia.com/gpu-10gb.product": product,
            "nvidia.com/gpu-10gb.count": str(6 if preset == "a100-mig-mixed" else count),
            "nvidia.com/gpu-10gb.memory": str(memory),
            "nvidia.com/gpu-10gb.replicas": str(replicas),
            "nvidia.com/gpu-10gb.sharing-strategy": strategy,
        }
    if example_name == "enforced-shares":  # memoryPerReplica 10Gi, time-slicing, not renamed
        replicas = memory // 10240
        shared = replicas > 1
        return gpu_labels(
            preset,
            replicas=replicas,
            strategy="time-slicing" if shared else "none",
            suffix="-SHARED" if shared else "",
        )
    if example_name == "per-gpu-replicas":
        if preset == "workstation":  # GPUs 1-3 do not exist
            return None
        # GPUs 0-1 have 8 replicas, 2-3 have 2: the largest is published.
        return gpu_labels(preset, replicas=8, strategy="time-slicing", suffix="-SHARED")
    if example_name == "mig-partitioning":
        if preset not in PARTITIONED:  # not 8 GPUs of a model with those profiles
            return None
        return {**gpu_labels(preset, mig_strategy="mixed"), **PARTITIONED[preset]}
    if example_name == "dynamic-mig":
        # GPUs 0-3 are dynamic (run-dra's placements: MIG on, nothing advertised here), 4-5
        # cut as 3g.40gb x2, 6-7 whole.
        if preset not in PARTITIONED:
            return None
        three = {k: v for k, v in PARTITIONED[preset].items() if "mig-3g.40gb" in k}
        return {**gpu_labels(preset, mig_strategy="mixed"), **three}
    assert example_name == "mig-mixed"
    if preset != "a100-mig-mixed":  # no MIG enabled: whole GPUs, the strategy still published
        return gpu_labels(preset, mig_strategy="mixed")
    return {
        # GPU 5 (A100-40GB) is the only GPU advertised whole: its product is the node's.
        "nvidia.com/gpu.product": A100_40,
        "nvidia.com/gpu.count": "2",
        "nvidia.com/gpu.memory": "40960",
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/gpu.family": "ampere",
        "nvidia.com/gpu.compute.major": "8",
        "nvidia.com/gpu.compute.minor": "0",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mps.capable": "false",
        "nvidia.com/mig.strategy": "mixed",
        **mig_labels(
            "1g.10gb",
            product=A100_80,
            count=9,
            memory=9728,
            sms=14,
            replicas=2,
            strategy="time-slicing",
            suffix="-SHARED",
        ),
        **mig_labels("2g.20gb", product=A100_80, count=2, memory=19968, sms=28),
        **mig_labels("3g.40gb", product=A100_80, count=2, memory=40192, sms=42),
        **mig_labels("4g.20gb", product=A100_40, count=1, memory=19968, sms=56),
        **mig_labels("2g.10gb", product=A100_40, count=1, memory=9856, sms=28),
        **mig_labels("1g.5gb.me", product=A100_40, count=1, memory=4864, sms=14),
    }


EXAMPLE_NAMES = sorted(p.stem for p in EXAMPLES.glob("*.yaml"))


def _labels_or_none(config: Config, preset: str) -> dict[str, str] | None:
    try:
        planned = plan_node(config, node(preset))
    except PlanError:
        return None
    return None if planned.problems else labels(config, planned)


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("example_name", EXAMPLE_NAMES)
def test_every_example_on_every_preset_labels_as_gfd_documents(
    example_name: str, preset: str
) -> None:
    assert _labels_or_none(example(example_name), preset) == expected(example_name, preset)


def test_the_examples_checked_are_all_there_are() -> None:
    assert EXAMPLE_NAMES == [
        "dynamic-mig",
        "enforced-shares",
        "mig-mixed",
        "mig-partitioning",
        "mps",
        "mps-memory",
        "per-gpu-replicas",
        "reference-health",
        "reference-readme",
        "time-slicing",
        "usage",
    ]


def test_gpu_operator_time_slicing_page_example() -> None:
    # The GPU Operator's page: 4 T4, timeSlicing gpu x4 -> count 4, Tesla-T4-SHARED, replicas 4.
    ts = config(sharing={"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}})
    got = labels(ts, plan_node(ts, node("t4x4")))
    assert got["nvidia.com/gpu.count"] == "4"
    assert got["nvidia.com/gpu.product"] == "Tesla-T4-SHARED"
    assert got["nvidia.com/gpu.replicas"] == "4"
    assert got["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert "nvidia.com/mig.strategy" not in got


def test_an_explicit_rename_drops_the_shared_suffix_but_keeps_replicas() -> None:
    renamed = config(
        sharing={"mps": {"resources": [{"name": "gpu", "rename": "gpu-quarter", "replicas": 4}]}}
    )
    got = labels(renamed, plan_node(renamed, node("t4x4")))
    assert got["nvidia.com/gpu.product"] == "Tesla-T4"
    assert got["nvidia.com/gpu.replicas"] == "4"
    assert got["nvidia.com/gpu.sharing-strategy"] == "mps"
    assert got["nvidia.com/mps.capable"] == "true"
    assert got["nvidia.com/gpu-quarter.count"] == "4"
    assert got["nvidia.com/gpu-quarter.replicas"] == "4"


def test_several_renamed_resources_each_get_labels_in_the_nvidia_domain_only() -> None:
    ts = config(
        sharing={
            "timeSlicing": {
                "resources": [
                    {"name": "gpu", "devices": [0, 1], "rename": "gpu-small", "replicas": 8},
                    {"name": "gpu", "devices": [2], "rename": "example.com/big", "replicas": 2},
                ]
            }
        }
    )
    got = labels(ts, plan_node(ts, node("t4x4")))
    # GPU 3 stays nvidia.com/gpu, unshared; the largest count over the GPUs is 8.
    assert got["nvidia.com/gpu.product"] == "Tesla-T4"
    assert got["nvidia.com/gpu.replicas"] == "8"
    assert got["nvidia.com/gpu.count"] == "4"
    small = {k: v for k, v in got.items() if k.startswith("nvidia.com/gpu-small.")}
    assert small == {
        "nvidia.com/gpu-small.product": "Tesla-T4",
        "nvidia.com/gpu-small.count": "2",
        "nvidia.com/gpu-small.memory": "15360",
        "nvidia.com/gpu-small.replicas": "8",
        "nvidia.com/gpu-small.sharing-strategy": "time-slicing",
    }
    assert not any(k.startswith("example.com/") for k in got)


def test_shared_suffix_when_only_some_replicas_keep_the_name() -> None:
    ts = config(
        sharing={
            "timeSlicing": {
                "resources": [
                    {"name": "gpu", "devices": [0], "replicas": 2},
                    {"name": "gpu", "devices": [1], "rename": "gpu-big", "replicas": 3},
                ]
            }
        }
    )
    got = labels(ts, plan_node(ts, node("t4x4")))
    assert got["nvidia.com/gpu.product"] == "Tesla-T4-SHARED"
    assert got["nvidia.com/gpu.replicas"] == "3"


def _uniform_node(tmp_path: Path, product: str, count: int, instances: list[str]) -> Inventory:
    path = tmp_path / "node.yaml"
    listed = ", ".join(f'"{i}"' for i in instances)
    path.write_text(
        f"gpus:\n  - product: {product}\n    count: {count}\n"
        f"    mig:\n      enabled: true\n      instances: [{listed}]\n"
    )
    return discover(SimulatedNvml.from_file(path))


def test_single_strategy_rewrites_gpu_labels_to_the_mig_device(tmp_path: Path) -> None:
    # The GFD README's example: 8 A100-40GB, each cut into seven 1g.5gb: 56 MIG devices.
    inventory = _uniform_node(tmp_path, "NVIDIA A100-SXM4-40GB", 8, ["1g.5gb"] * 7)
    single = config(flags={"migStrategy": "single"})
    got = labels(single, plan_node(single, inventory))
    assert got == {
        "nvidia.com/mig.strategy": "single",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mps.capable": "false",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
        "nvidia.com/gpu.count": "56",
        "nvidia.com/gpu.memory": "4864",
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/gpu.multiprocessors": "14",
        "nvidia.com/gpu.slices.gi": "1",
        "nvidia.com/gpu.slices.ci": "1",
        "nvidia.com/gpu.family": "ampere",
        "nvidia.com/gpu.compute.major": "8",
        "nvidia.com/gpu.compute.minor": "0",
    }


def test_single_strategy_shared_mig_devices_get_the_suffix(tmp_path: Path) -> None:
    inventory = _uniform_node(tmp_path, "NVIDIA A100-SXM4-80GB", 2, ["3g.40gb"] * 2)
    single = config(
        flags={"migStrategy": "single"},
        sharing={"timeSlicing": {"resources": [{"name": "gpu", "replicas": 3}]}},
    )
    got = labels(single, plan_node(single, inventory))
    assert got["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb-SHARED"
    assert got["nvidia.com/gpu.count"] == "4"
    assert got["nvidia.com/gpu.replicas"] == "3"
    assert got["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert got["nvidia.com/gpu.memory"] == "40192"


def test_single_strategy_with_an_empty_mig_gpu_is_gfds_invalid(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text(
        "gpus:\n"
        "  - product: NVIDIA A100-SXM4-80GB\n"
        "    mig: {enabled: true, instances: [1g.10gb, 1g.10gb]}\n"
        "  - product: NVIDIA A100-SXM4-80GB\n"
        "    mig: {enabled: true}\n"
    )
    inventory = discover(SimulatedNvml.from_file(path))
    # While a declared layout is still to be created, the daemon serves the node as it is.
    single = config(
        flags={"migStrategy": "single"},
        partitioning={"mig": [{"devices": [1], "profiles": {"1g.10gb": 2}}]},
    )
    got = labels(single, plan_node(single, inventory, as_is=True))
    assert got["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB-MIG-INVALID"
    assert (got["nvidia.com/gpu.count"], got["nvidia.com/gpu.replicas"]) == ("0", "0")
    assert got["nvidia.com/gpu.memory"] == "0"
    # Once applied, the same config labels the MIG devices.
    planned = labels(single, plan_node(single, inventory))
    assert planned["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb"
    assert planned["nvidia.com/gpu.count"] == "4"


def test_mixed_strategy_with_every_gpu_in_mig_has_no_whole_gpu_replicas(tmp_path: Path) -> None:
    inventory = _uniform_node(tmp_path, "NVIDIA H100 80GB HBM3", 2, ["7g.80gb"])
    mixed = config(flags={"migStrategy": "mixed"})
    got = labels(mixed, plan_node(mixed, inventory))
    assert got["nvidia.com/gpu.replicas"] == "0"
    assert got["nvidia.com/gpu.count"] == "2"
    assert got["nvidia.com/mig-7g.80gb.count"] == "2"
    assert got["nvidia.com/mig-7g.80gb.product"] == "NVIDIA-H100-80GB-HBM3-MIG-7g.80gb"


def test_renamed_mig_profile_drops_the_suffix() -> None:
    mixed = config(
        flags={"migStrategy": "mixed"},
        sharing={
            "timeSlicing": {
                "resources": [{"name": "mig-1g.10gb", "rename": "mig-small", "replicas": 2}]
            }
        },
    )
    got = labels(mixed, plan_node(mixed, node("a100-mig-mixed")))
    assert got["nvidia.com/mig-1g.10gb.product"] == "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb"
    assert got["nvidia.com/mig-1g.10gb.replicas"] == "2"
    assert got["nvidia.com/mig-1g.10gb.count"] == "9"
    assert got["nvidia.com/mig-small.count"] == "9"
    assert got["nvidia.com/mig-small.product"] == "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb"


def test_health_changes_no_label() -> None:
    ts = example("reference-health")
    planned = plan_node(ts, node("dgx-h100"))
    sick = planned.plan.with_health({planned.inventory.gpus[0].uuid: False})
    assert labels_for(ts, planned.inventory, sick) == labels(ts, planned)


def test_a_node_without_gpus_has_no_labels() -> None:
    empty = Inventory(gpus=())
    assert labels_for(config(), empty, plan_node(config(), empty).plan) == {}


_KEY = re.compile(r"nvidia\.com/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")


@pytest.mark.parametrize("preset", PRESETS)
def test_every_key_is_owned_and_every_label_is_valid_for_kubernetes(preset: str) -> None:
    for example_name in EXAMPLE_NAMES:
        got = _labels_or_none(example(example_name), preset) or {}
        for key, value in got.items():
            assert owns(key), key
            assert _KEY.fullmatch(key), key
            assert _VALUE.fullmatch(value), (key, value)


@pytest.mark.parametrize(
    "key",
    [
        "nvidia.com/gpu.present",
        "nvidia.com/cuda.driver.major",
        "nvidia.com/gpu.deploy.device-plugin",
        "nvidia.com/mig.config",
        "nvidia.com/mig.config.state",
        "nvidia.com/device-plugin.config",
        "nvidia.com/gfd.timestamp",
        "nvidia.com/gpu.engines.copy",
        "example.com/gpu.count",
        "feature.node.kubernetes.io/pci-10de.present",
    ],
)
def test_keys_of_others_are_not_owned(key: str) -> None:
    assert not owns(key)


def test_render_is_sorted_key_value_lines() -> None:
    assert render_labels({"b": "2", "a": "1"}) == "a=1\nb=2\n"
    assert render_labels({}) == ""


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("NVIDIA A100 80GB PCIe", "NVIDIA-A100-80GB-PCIe"),
        ("Tesla T4", "Tesla-T4"),
        ("NVIDIA  GeForce RTX 4090 (rev 2)", "NVIDIA-GeForce-RTX-4090-rev-2"),
        ("x" * 80, "x" * 63),
        ("NVIDIA " + "A" * 55 + " -B", "NVIDIA-" + "A" * 55),
    ],
)
def test_product_values_are_written_as_gfd_writes_them(name: str, value: str) -> None:
    assert gfd_label_value(name) == value
