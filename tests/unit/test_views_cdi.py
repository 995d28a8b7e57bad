"""The CDI spec of a prepared claim gives what Allocate gives for the envvar strategy."""

from __future__ import annotations

import pytest
from plan_factory import config, gpu, mps, node, time_slicing

from sharing_plugin.config.base import SharedDevices
from sharing_plugin.config.model import Config
from sharing_plugin.errors import AllocationError
from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.plan import plan
from sharing_plugin.views.cdi import cdi_id, claim_spec, spec_file_name
from sharing_plugin.views.dra import DraDevice, dra_devices

DRIVER = "gpu.sharing-plugin.io"
UID = "0b9c2f5e-1111-4222-8333-444455556666"
GPU0 = "GPU-00000000-0000-4000-8000-000000000000"
GPU1 = "GPU-00000001-0000-4000-8000-000000000000"


def spec_for(cfg: Config, inventory: Inventory, names: list[str]) -> dict[str, object]:
    p = plan(cfg, inventory)
    by_name = {d.name: d for d in dra_devices(p, inventory, shared=SharedDevices.REPLICAS)}
    chosen: list[DraDevice] = [by_name[n] for n in names]
    return claim_spec(driver=DRIVER, claim_uid=UID, devices=chosen, plan=p, flags=cfg.flags)


def test_ids_and_file_name() -> None:
    assert cdi_id(DRIVER, UID, "gpu-x-r1") == f"gpu.sharing-plugin.io/claim={UID}-gpu-x-r1"
    assert spec_file_name(DRIVER, UID) == f"gpu.sharing-plugin.io-claim_{UID}.json"


def test_every_device_says_the_claims_unique_physical_uuids_in_order() -> None:
    inventory = node(gpu(0), gpu(1))
    cfg = time_slicing({"name": "gpu", "replicas": 2})
    names = [
        "gpu-00000001-0000-4000-8000-000000000000-r0",
        "gpu-00000000-0000-4000-8000-000000000000-r1",
        "gpu-00000001-0000-4000-8000-000000000000-r1",
    ]
    spec = spec_for(cfg, inventory, names)
    assert spec["cdiVersion"] == "0.5.0"
    assert spec["kind"] == "gpu.sharing-plugin.io/claim"
    assert spec["devices"] == [
        {
            "name": f"{UID}-{n}",
            "containerEdits": {"env": [f"NVIDIA_VISIBLE_DEVICES={GPU1},{GPU0}"]},
        }
        for n in names
    ]


def test_index_strategy_tells_indexes() -> None:
    inventory = node(gpu(0), gpu(1))
    cfg = config(flags={"plugin": {"deviceIDStrategy": "index"}})
    spec = spec_for(cfg, inventory, ["gpu-00000001-0000-4000-8000-000000000000"])
    (device,) = spec["devices"]  # type: ignore[misc]
    assert device["containerEdits"]["env"] == ["NVIDIA_VISIBLE_DEVICES=1"]


def test_other_list_strategies_still_give_the_envvar_answer() -> None:
    inventory = node(gpu(0))
    cfg = config(flags={"plugin": {"deviceListStrategy": ["volume-mounts", "cdi-cri"]}})
    spec = spec_for(cfg, inventory, ["gpu-00000000-0000-4000-8000-000000000000"])
    (device,) = spec["devices"]  # type: ignore[misc]
    assert device["containerEdits"] == {"env": [f"NVIDIA_VISIBLE_DEVICES={GPU0}"]}


def test_mps_devices_get_the_pipe_directory_and_mounts() -> None:
    inventory = node(gpu(0))
    cfg = mps({"name": "gpu", "replicas": 2}, renameByDefault=True)
    spec = spec_for(cfg, inventory, ["gpu-00000000-0000-4000-8000-000000000000-r0"])
    (device,) = spec["devices"]  # type: ignore[misc]
    assert device["containerEdits"] == {
        "env": [
            f"NVIDIA_VISIBLE_DEVICES={GPU0}",
            "CUDA_MPS_PIPE_DIRECTORY=/mps/nvidia.com/gpu.shared/pipe",
        ],
        "mounts": [
            {
                "hostPath": "/run/nvidia/mps/nvidia.com/gpu.shared/pipe",
                "containerPath": "/mps/nvidia.com/gpu.shared/pipe",
                "options": ["rw", "nosuid", "nodev", "bind"],
            },
            {
                "hostPath": "/run/nvidia/mps/shm",
                "containerPath": "/dev/shm",
                "options": ["rw", "nosuid", "nodev", "bind"],
            },
        ],
    }


def test_more_than_one_replica_is_refused_where_allocate_refuses_it() -> None:
    inventory = node(gpu(0))
    cfg = time_slicing({"name": "gpu", "replicas": 4}, failRequestsGreaterThanOne=True)
    with pytest.raises(AllocationError, match="maximum request size for shared resources is 1"):
        spec_for(
            cfg,
            inventory,
            [
                "gpu-00000000-0000-4000-8000-000000000000-r0",
                "gpu-00000000-0000-4000-8000-000000000000-r1",
            ],
        )
