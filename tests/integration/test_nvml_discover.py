"""The NVML adapter's discovery, run over the simulated pynvml for every preset and for files."""

from __future__ import annotations

from collections import Counter
from itertools import combinations
from pathlib import Path

import pytest
import yaml_fast
from support.observe import set_lost

from sharing_plugin.backends import backend_from_spec
from sharing_plugin.errors import ConfigError, GpuLostError, NvmlError
from sharing_plugin.gpus.inventory import Topology
from sharing_plugin.nvml.discover import discover
from sharing_plugin.sim.nvml.node import load_preset, parse_instance, preset_names
from sharing_plugin.sim.nvml.simulated import SimulatedNvml


def test_the_presets_the_issue_asks_for_exist() -> None:
    assert {
        "dgx-a100-80gb",
        "dgx-h100",
        "hgx-h200",
        "t4x4",
        "a100-mig-mixed",
        "workstation",
    } <= set(preset_names())


@pytest.mark.parametrize("preset", preset_names())
def test_discovery_matches_the_description(preset: str) -> None:
    description = load_preset(preset).description
    inventory = discover(backend_from_spec(f"simulated:{preset}"))

    expected = [group for group in description.gpus for _ in range(group.count)]
    assert len(inventory.gpus) == len(expected)
    assert inventory.warnings == ()
    for gpu, group in zip(inventory.gpus, expected, strict=True):
        assert gpu.product == group.product
        assert gpu.numa_node == group.numa_node
        assert gpu.healthy_at_discovery
        assert gpu.memory_mib > 0
        assert gpu.uuid.startswith("GPU-")
        assert gpu.minor == gpu.index
        wanted = group.mig.instances if group.mig is not None else ()
        assert gpu.mig_enabled == (group.mig is not None and group.mig.enabled)
        assert Counter(m.profile for m in gpu.mig_devices) == Counter(
            parse_instance(i)[0] for i in wanted
        )
        for text in wanted:  # explicit starts are honoured
            name, start = parse_instance(text)
            if start is not None:
                assert any(
                    m.profile == name and m.placement.start == start for m in gpu.mig_devices
                )
        for a, b in combinations(gpu.mig_devices, 2):
            assert not a.placement.overlaps(b.placement)
            assert a.uuid != b.uuid
        for mig in gpu.mig_devices:
            assert mig.uuid.startswith("MIG-")
            assert mig.parent_uuid == gpu.uuid
            assert mig.memory_mib > 0
            assert inventory.mig_device(mig.uuid) == mig

    n = len(expected)
    assert len(inventory.links) == n * (n - 1) // 2
    for a, b in combinations(range(n), 2):
        link = inventory.link(a, b)
        assert link is not None
        same_product = expected[a].product == expected[b].product
        assert (link.nvlinks > 0) == (description.nvlink == "all" and same_product)
        same_numa = expected[a].numa_node == expected[b].numa_node
        assert link.topology == (Topology.NODE if same_numa else Topology.SYSTEM)


def test_uuids_are_deterministic_and_distinct_per_node() -> None:
    first = discover(backend_from_spec("simulated:dgx-h100"))
    again = discover(backend_from_spec("simulated:dgx-h100"))
    other = discover(backend_from_spec("simulated:hgx-h200"))
    assert [g.uuid for g in first.gpus] == [g.uuid for g in again.gpus]
    assert len({g.uuid for g in first.gpus}) == 8
    assert not {g.uuid for g in first.gpus} & {g.uuid for g in other.gpus}


def test_mig_uuids_are_stable_across_runs() -> None:
    first = discover(backend_from_spec("simulated:a100-mig-mixed"))
    again = discover(backend_from_spec("simulated:a100-mig-mixed"))
    assert [m.uuid for g in first.gpus for m in g.mig_devices] == [
        m.uuid for g in again.gpus for m in g.mig_devices
    ]


def test_a_node_file_places_instances_so_that_all_fit(tmp_path: Path) -> None:
    # 4g.20gb only starts at 0, so the 3g.20gb listed first must move to 4.
    node = tmp_path / "node.yaml"
    node.write_text(
        yaml_fast.dump(
            {
                "gpus": [
                    {
                        "product": "NVIDIA A100-SXM4-40GB",
                        "mig": {"enabled": True, "instances": ["3g.20gb", "4g.20gb"]},
                    }
                ]
            }
        )
    )
    inventory = discover(backend_from_spec(f"simulated:{node}"))
    placed = {m.profile: m.placement.start for m in inventory.gpus[0].mig_devices}
    assert placed == {"4g.20gb": 0, "3g.20gb": 4}


def test_instances_that_cannot_fit_name_the_gpu(tmp_path: Path) -> None:
    node = tmp_path / "node.yaml"
    node.write_text(
        yaml_fast.dump(
            {
                "gpus": [
                    {"product": "Tesla T4"},
                    {
                        "product": "NVIDIA A100-SXM4-40GB",
                        "mig": {"instances": ["4g.20gb", "2g.10gb", "2g.10gb"]},
                    },
                ]
            }
        )
    )
    with pytest.raises(ConfigError, match=r"GPU 1, NVIDIA A100-SXM4-40GB.*do not fit"):
        backend_from_spec(f"simulated:{node}")


def test_unknown_profiles_and_keys_are_precise_errors(tmp_path: Path) -> None:
    node = tmp_path / "node.yaml"
    node.write_text("gpus:\n  - product: NVIDIA A30\n    mig: {instances: [3g.12gb]}\n")
    with pytest.raises(ConfigError, match=r"unknown MIG profile '3g.12gb'.*1g.6gb"):
        backend_from_spec(f"simulated:{node}")
    node.write_text("gpus:\n  - product: NVIDIA A30\n    numa: 1\n")
    with pytest.raises(ConfigError) as caught:
        backend_from_spec(f"simulated:{node}")
    assert caught.value.problems[0].path == "gpus[0].numa"


def test_an_unknown_product_is_simulated_without_mig_and_warned_about(tmp_path: Path) -> None:
    node = tmp_path / "node.yaml"
    node.write_text("gpus:\n  - product: NVIDIA Imaginary 9000\n    count: 2\n")
    sim = backend_from_spec(f"simulated:{node}")
    assert isinstance(sim, SimulatedNvml)
    assert "not in the catalog" in sim.warnings[0]
    inventory = discover(sim)
    assert [g.product for g in inventory.gpus] == ["NVIDIA Imaginary 9000"] * 2
    assert not inventory.gpus[0].mig_capable


def test_an_unknown_preset_lists_the_presets() -> None:
    with pytest.raises(ConfigError, match=r"unknown simulated node preset 'dgx-z9'.*t4x4"):
        backend_from_spec("simulated:dgx-z9")
    with pytest.raises(ConfigError, match=r"unknown GPU backend 'fake'"):
        backend_from_spec("fake")


def test_the_real_backend_is_pynvml() -> None:
    import pynvml

    assert backend_from_spec("nvml") is pynvml


def test_a_lost_gpu_is_reported_not_fatal() -> None:
    sim = SimulatedNvml.from_preset("t4x4")
    set_lost(sim, 2)
    inventory = discover(sim)
    lost = inventory.gpus[2]
    assert not lost.healthy_at_discovery
    assert lost.problem is not None and "NVML_ERROR_GPU_IS_LOST" in lost.problem
    assert [g.healthy_at_discovery for g in inventory.gpus] == [True, True, False, True]
    assert "GPU 2" in inventory.warnings[0]
    assert len(inventory.links) == 3  # only between the GPUs that answered


def test_fail_on_init_error_raises_instead() -> None:
    sim = SimulatedNvml.from_preset("t4x4")
    set_lost(sim, "GPU-" + "0" * 32)  # unknown: ignored
    set_lost(sim, 1)
    with pytest.raises(GpuLostError, match="GPU 1: getting its handle: NVML_ERROR_GPU_IS_LOST"):
        discover(sim, fail_on_init_error=True)


def test_a_lost_gpu_comes_back() -> None:
    sim = SimulatedNvml.from_preset("workstation")
    set_lost(sim, 0)
    assert not discover(sim).gpus[0].healthy_at_discovery
    set_lost(sim, 0, lost=False)
    assert discover(sim).gpus[0].healthy_at_discovery


def test_calls_before_init_fail_as_nvml_does() -> None:
    import pynvml

    sim = SimulatedNvml.from_preset("workstation")
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        sim.nvmlDeviceGetCount()


def test_nvml_init_failure_without_fail_on_init_error_gives_an_empty_inventory() -> None:
    class NoDriver:
        """A pynvml whose library is missing, as on a node without the NVIDIA driver."""

        def __getattr__(self, name: str) -> object:
            import pynvml

            return getattr(pynvml, name)

        def nvmlInit(self) -> None:
            import pynvml

            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    inventory = discover(NoDriver())
    assert inventory.gpus == ()
    assert "NVML_ERROR_LIBRARY_NOT_FOUND" in inventory.warnings[0]
    with pytest.raises(NvmlError, match="initialising NVML: NVML_ERROR_LIBRARY_NOT_FOUND"):
        discover(NoDriver(), fail_on_init_error=True)
