"""plan() with sharing: replicas, names, selections, per-GPU counts, MPS limits."""

from __future__ import annotations

import dataclasses

import pytest
from plan_factory import T4, config, gpu, gpu_uuid, mig_uuid, mps, node, time_slicing

from sharing_plugin.config.model import SharingKind
from sharing_plugin.errors import PlanError
from sharing_plugin.plan import plan
from sharing_plugin.plan.model import DeviceId, GpuUuid, VirtualDevice, replica_id
from sharing_plugin.plan.share import _replica, _Share


def test_replicas_under_the_same_name_with_reference_ids() -> None:
    p = plan(time_slicing({"name": "gpu", "replicas": 3}), node(gpu(0), gpu(1)))
    (res,) = p.resources
    assert res.name == "nvidia.com/gpu"
    assert res.sharing is SharingKind.TIME_SLICING
    assert res.ids == tuple(f"{gpu_uuid(g)}::{n}" for g in (0, 1) for n in range(3))
    d = res.devices[4]
    assert (d.physical, d.replica, d.replicas, d.index) == (gpu_uuid(1), 1, 3, "1")


def test_rename_and_rename_by_default() -> None:
    inv = node(gpu(0))
    renamed = plan(time_slicing({"name": "gpu", "rename": "gpu-shared", "replicas": 2}), inv)
    assert [r.name for r in renamed.resources] == ["nvidia.com/gpu-shared"]
    by_default = plan(time_slicing({"name": "gpu", "replicas": 2}, renameByDefault=True), inv)
    assert [r.name for r in by_default.resources] == ["nvidia.com/gpu.shared"]


def test_unselected_devices_stay_unshared_under_the_original_name() -> None:
    cfg = time_slicing({"name": "gpu", "devices": [1], "replicas": 2}, renameByDefault=True)
    p = plan(cfg, node(gpu(0), gpu(1), gpu(2)))
    plain, shared = p.resources
    assert plain.name == "nvidia.com/gpu" and plain.ids == (gpu_uuid(0), gpu_uuid(2))
    assert plain.sharing is SharingKind.NONE
    assert shared.name == "nvidia.com/gpu.shared"
    assert shared.ids == (f"{gpu_uuid(1)}::0", f"{gpu_uuid(1)}::1")


def test_count_selection_takes_the_first_devices() -> None:
    p = plan(time_slicing({"name": "gpu", "devices": 1, "replicas": 2}), node(gpu(0), gpu(1)))
    assert p.resources[0].ids == (f"{gpu_uuid(0)}::0", f"{gpu_uuid(0)}::1", gpu_uuid(1))


def test_count_larger_than_the_node_is_an_error() -> None:
    with pytest.raises(PlanError) as err:
        plan(time_slicing({"name": "gpu", "devices": 3, "replicas": 2}), node(gpu(0)))
    (problem,) = err.value.problems
    assert problem.path == "sharing.timeSlicing.resources[0].devices"
    assert "first 3" in problem.message and "has 1" in problem.message


def test_several_entries_give_per_gpu_replica_counts() -> None:
    cfg = time_slicing(
        {"name": "gpu", "devices": [0], "replicas": 2},
        {"name": "gpu", "devices": [gpu_uuid(1)], "replicas": 4},
    )
    res = plan(cfg, node(gpu(0), gpu(1))).resources[0]
    assert res.replicas_by_physical() == {gpu_uuid(0): 2, gpu_uuid(1): 4}


def test_every_reference_form_selects_its_device() -> None:
    inv = node(gpu(0, migs=("1g.10gb", "1g.10gb", "2g.20gb")), gpu(1, migs=("1g.10gb",)))
    cfg = config(
        flags={"migStrategy": "mixed"},
        sharing={
            "timeSlicing": {
                "resources": [
                    {
                        "name": "mig-1g.10gb",
                        "devices": ["0:1", mig_uuid(1, 0), f"MIG-{gpu_uuid(0)}/1/0"],
                        "replicas": 2,
                    }
                ]
            }
        },
    )
    res = plan(cfg, inv).resource("nvidia.com/mig-1g.10gb")
    assert res is not None
    assert res.replicas_by_physical() == {mig_uuid(0, 0): 2, mig_uuid(0, 1): 2, mig_uuid(1, 0): 2}


def test_product_selection_and_a_product_matching_nothing_warns() -> None:
    inv = node(gpu(0), gpu(1, product=T4))
    cfg = time_slicing(
        {"name": "gpu", "devices": [{"product": "Tesla*"}, {"product": "*H100*"}], "replicas": 2}
    )
    p = plan(cfg, inv)
    assert p.resources[0].replicas_by_physical() == {gpu_uuid(0): 1, gpu_uuid(1): 2}
    (warning,) = p.warnings
    assert warning.startswith("sharing.timeSlicing.resources[0].devices[1]:")
    assert "*H100*" in warning


def test_a_selection_naming_a_missing_device_is_an_error_naming_it() -> None:
    cfg = time_slicing({"name": "gpu", "devices": [0, 5, "0:3"], "replicas": 2})
    with pytest.raises(PlanError) as err:
        plan(cfg, node(gpu(0), gpu(1)))
    paths = [(p.path, p.message) for p in err.value.problems]
    assert [p for p, _ in paths] == [
        "sharing.timeSlicing.resources[0].devices[1]",
        "sharing.timeSlicing.resources[0].devices[2]",
    ]
    assert "GPU 5 does not exist" in paths[0][1] and "GPU 0, 1" in paths[0][1]
    assert "MIG device 0:3" in paths[1][1]


def test_a_device_advertised_under_another_name_is_explained() -> None:
    inv = node(gpu(0, migs=("1g.10gb",)), gpu(1))
    cfg = config(
        flags={"migStrategy": "mixed"},
        sharing={
            "timeSlicing": {"resources": [{"name": "gpu", "devices": ["0:0"], "replicas": 2}]}
        },
    )
    with pytest.raises(PlanError) as err:
        plan(cfg, inv)
    (problem,) = err.value.problems
    assert "advertised as nvidia.com/mig-1g.10gb, not nvidia.com/gpu" in problem.message


def test_sharing_a_name_the_node_lacks_warns() -> None:
    p = plan(time_slicing({"name": "mig-1g.10gb", "replicas": 2}), node(gpu(0)))
    assert [r.name for r in p.resources] == ["nvidia.com/gpu"]
    assert "no nvidia.com/mig-1g.10gb devices" in p.warnings[0]


def test_ids_are_stable_when_replicas_grow() -> None:
    inv = node(gpu(0), gpu(1))
    four = plan(time_slicing({"name": "gpu", "replicas": 4}), inv).resources[0].ids
    eight = plan(time_slicing({"name": "gpu", "replicas": 8}), inv).resources[0].ids
    for g in (0, 1):
        assert [i for i in four if i.startswith(gpu_uuid(g))] == [
            i for i in eight if i.startswith(gpu_uuid(g))
        ][:4]


def test_mps_sharing_and_its_options() -> None:
    res = plan(mps({"name": "gpu", "replicas": 4}), node(gpu(0))).resources[0]
    assert res.sharing is SharingKind.MPS
    assert res.fail_requests_greater_than_one  # the MPS default
    assert len(res.devices) == 4


def test_mps_client_limit_by_compute_capability() -> None:
    assert plan(mps({"name": "gpu", "replicas": 48}), node(gpu(0))).resources[0].devices
    with pytest.raises(PlanError) as err:
        plan(mps({"name": "gpu", "replicas": 49}), node(gpu(0)))
    (problem,) = err.value.problems
    assert problem.path == "sharing.mps.resources[0].replicas"
    assert "48" in problem.message
    volta = node(gpu(0, cc=(7, 0)))
    assert plan(mps({"name": "gpu", "replicas": 16}), volta).resources
    with pytest.raises(PlanError, match="at most 16"):
        plan(mps({"name": "gpu", "replicas": 17}), volta)


def test_mps_on_mig_devices_is_an_error() -> None:
    cfg = config(
        flags={"migStrategy": "single"},
        sharing={"mps": {"resources": [{"name": "gpu", "replicas": 2}]}},
    )
    with pytest.raises(PlanError) as err:
        plan(cfg, node(gpu(0, migs=("1g.10gb", "1g.10gb"))))
    (problem,) = err.value.problems
    assert problem.path == "sharing.mps.resources[0].devices"
    assert "MPS cannot share MIG devices" in problem.message


def test_a_replica_copies_every_field_of_its_device() -> None:
    # _replica spells the fields out for speed; a field it forgot would silently reset.
    device = VirtualDevice(
        id=DeviceId("MIG-x"),
        physical="MIG-x",
        gpu_uuid=GpuUuid("GPU-y"),
        index="1:2",
        numa=3,
        paths=("/dev/nvidia1",),
        healthy=False,
        discovered_healthy=False,
        replica=None,
        replicas=1,
        is_mig=True,
        compute_capability=(9, 0),
    )
    assert len(dataclasses.fields(VirtualDevice)) == 13, "a new field: copy it in _replica"
    expected = dataclasses.replace(
        device, id=replica_id("MIG-x", 4), replica=4, replicas=5, memory_cap_mib=1234
    )
    assert _replica(device, 4, _Share("nvidia.com/gpu", 5, "p", cap_mib=1234)) == expected
