"""A dynamic MIG GPU's counter set and placement devices, as the pool publishes them."""

from __future__ import annotations

from typing import Any

from sharing_plugin.config.model import Config
from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.nvml.discover import discover
from sharing_plugin.sim.nvml.simulated import SimulatedNvml
from sharing_plugin.views.dra_api import DeviceTaint, PublishedDevice
from sharing_plugin.views.dra_mig import DynamicPool, dynamic_pool, placement_name

MIXED = discover(SimulatedNvml.from_preset("a100-mig-mixed"))  # 0: 3g.40gb@0 2g.20gb@4 1g.10gb@6
H200 = discover(SimulatedNvml.from_preset("hgx-h200"))  # MIG off
GPU0, GPU3 = MIXED.gpus[0], MIXED.gpus[3]  # GPU 3: MIG on, no instances


def pool(devices: Any, inventory: Inventory = MIXED, **extra: Any) -> DynamicPool:
    config = Config.model_validate(
        {"partitioning": {"mig": [{"devices": devices, "dynamic": True}]}, **extra}
    )
    return dynamic_pool(config, inventory)


def by_name(devices: tuple[PublishedDevice, ...]) -> dict[str, PublishedDevice]:
    return {d.name: d for d in devices}


def test_an_empty_a100_has_one_device_per_placement_consuming_its_slices() -> None:
    sets, devices = pool([3]).published()
    (counters,) = sets
    assert counters.name == f"{GPU3.uuid.lower()}-mig"
    assert counters.counters == {
        **{f"memory-slice-{i}": 1 for i in range(8)},
        "compute-slices": 7,
        "media-extensions": 1,
    }
    assert len(devices) == 7 + 7 + 4 + 3 + 2 + 1 + 1  # every start of every profile
    three = by_name(devices)[placement_name(GPU3.uuid, "3g.40gb", 4)]
    assert three.name == f"{GPU3.uuid.lower()}-3g-40gb-at-4"
    assert dict(three.attributes) == {
        "type": {"string": "mig"},
        "resource": {"string": "nvidia.com/mig-3g.40gb"},
        "uuid": {"string": GPU3.uuid},  # no MIG device before a claim makes it: the GPU's
        "parentUUID": {"string": GPU3.uuid},
        "productName": {"string": "NVIDIA A100-SXM4-80GB"},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": "Ampere"},
        "cudaComputeCapability": {"version": "8.0.0"},
        "driverVersion": {"version": "550.54.15"},
        "cudaDriverVersion": {"version": "12.4.0"},
        "pcieBusID": {"string": "0000:37:00.0"},
        "resource.kubernetes.io/pciBusID": {"string": "0000:37:00.0"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:30"},
        "resource.kubernetes.io/numaNode": {"int": 1},
        "sharing": {"string": "none"},
        "index": {"int": 3},
        "migProfile": {"string": "3g.40gb"},
        "profile": {"string": "3g.40gb"},
        "migStart": {"int": 4},
    }
    assert three.capacity["memory"].value == "40192Mi"
    assert three.consumes == {
        counters.name: {
            "memory-slice-4": 1,
            "memory-slice-5": 1,
            "memory-slice-6": 1,
            "memory-slice-7": 1,
            "compute-slices": 3,
        }
    }
    me = by_name(devices)[placement_name(GPU3.uuid, "1g.10gb+me", 2)]
    assert me.name.endswith("-1g-10gb-me-at-2")
    assert me.attributes["resource"] == {"string": "nvidia.com/mig-1g.10gb.me"}
    assert me.consumes[counters.name]["media-extensions"] == 1


def test_names_are_dns_labels_for_every_catalogued_model() -> None:
    for inventory in (MIXED, H200):
        enabled = Inventory(
            gpus=tuple(g.__class__(**{**_fields(g), "mig_enabled": True}) for g in inventory.gpus)
        )
        _, devices = pool("all", enabled).published()
        assert devices
        for device in devices:
            assert len(device.name) <= 63 and device.name.replace("-", "").isalnum()


def _fields(gpu: Any) -> dict[str, Any]:
    return {f: getattr(gpu, f) for f in gpu.__dataclass_fields__}


def test_existing_instances_take_their_slices_and_are_adopted_as_published() -> None:
    sets, devices = pool([0]).published()
    (counters,) = sets
    # 3g.40gb@0, 2g.20gb@4 and 1g.10gb@6 occupy slices 0-6 and 6 of 7 compute slices.
    assert counters.counters == {
        **{f"memory-slice-{i}": 0 for i in range(7)},
        "memory-slice-7": 1,
        "compute-slices": 1,
        "media-extensions": 1,
    }
    found = by_name(devices)
    for profile, start in (("3g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 6)):
        assert found[placement_name(GPU0.uuid, profile, start)].consumes == {}
    # Every other placement still consumes, so none of them can be allocated now.
    assert found[placement_name(GPU0.uuid, "7g.80gb", 0)].consumes
    assert sum(1 for d in devices if not d.consumes) == 3


def test_a_held_instance_is_counted_by_the_allocator_not_the_counters() -> None:
    held = placement_name(GPU0.uuid, "3g.40gb", 0)
    sets, devices = pool([0]).published(held={held})
    (counters,) = sets
    assert [counters.counters[f"memory-slice-{i}"] for i in range(8)] == [1] * 4 + [0] * 3 + [1]
    assert counters.counters["compute-slices"] == 4
    assert by_name(devices)[held].consumes  # allocated: consumes like any other


def test_mig_mode_off_publishes_nothing_for_the_gpu_yet() -> None:
    dynamic = pool([1], H200)
    assert dynamic.gpu_uuids == {H200.gpus[1].uuid}
    assert dynamic.published() == ((), ())


def test_an_unhealthy_gpu_leaves_the_pool_but_keeps_what_claims_hold() -> None:
    config = Config.model_validate({"partitioning": {"mig": [{"devices": [3], "dynamic": True}]}})
    sick = dynamic_pool(config, MIXED, unhealthy={GPU3.uuid})
    held = placement_name(GPU3.uuid, "1g.10gb", 0)
    sets, devices = sick.published(held={held})
    assert [d.name for d in devices] == [held] and len(sets) == 1
    assert not sick.healthy(held)
    taint = DeviceTaint("gpu.sharing-plugin.io/unhealthy", "xid-79")
    _, tainted = sick.published(held={held}, taints={GPU3.uuid: taint})
    assert len(tainted) == 25
    assert all(d.taints == (taint,) for d in tainted if d.name != held)
    assert by_name(tainted)[held].taints == ()


def test_a_mig_pattern_renames_the_placements_resource() -> None:
    dynamic = pool([3], resources={"mig": [{"pattern": "3g.*", "name": "nvidia.com/big-slice"}]})
    _, devices = dynamic.published()
    names = {str(d.attributes["resource"]["string"]) for d in devices}
    assert "nvidia.com/big-slice" in names and "nvidia.com/mig-2g.20gb" in names
    assert "nvidia.com/mig-3g.40gb" not in names
