"""allocate(): every device list strategy, device ID strategy, device specs, MPS, refusals."""

from __future__ import annotations

from typing import Any

import pytest
from plan_factory import config, gpu, gpu_uuid, mig_uuid, mps, node, time_slicing

from sharing_plugin.errors import AllocationError
from sharing_plugin.plan import DeviceSpec, Mount, allocate, plan
from sharing_plugin.plan.build import mig_capability_paths


def flags(**plugin: Any) -> Any:
    return config(flags={"plugin": plugin}).flags


INV = node(gpu(0), gpu(1), gpu(2))
SHARED = plan(time_slicing({"name": "gpu", "replicas": 4}), INV).resources[0]
WHOLE = plan(config(), INV).resources[0]


def test_envvar_lists_unique_physical_ids_in_request_order() -> None:
    ids = [f"{gpu_uuid(2)}::1", f"{gpu_uuid(0)}::3", f"{gpu_uuid(2)}::0"]
    a = allocate(SHARED, ids, flags())
    assert a.envs == {"NVIDIA_VISIBLE_DEVICES": f"{gpu_uuid(2)},{gpu_uuid(0)}"}
    assert a.physical == (gpu_uuid(2), gpu_uuid(0))
    assert (a.mounts, a.devices, a.annotations, a.cdi_devices) == ((), (), {}, ())


def test_index_strategy_tells_indexes_but_advertises_uuids() -> None:
    a = allocate(WHOLE, [gpu_uuid(1), gpu_uuid(0)], flags(deviceIDStrategy="index"))
    assert a.envs["NVIDIA_VISIBLE_DEVICES"] == "1,0"
    inv = node(gpu(0, migs=("1g.10gb", "1g.10gb")))
    res = plan(config(flags={"migStrategy": "single"}), inv).resources[0]
    a = allocate(res, [mig_uuid(0, 1)], flags(deviceIDStrategy="index"))
    assert a.envs["NVIDIA_VISIBLE_DEVICES"] == "0:1"


def test_volume_mounts() -> None:
    a = allocate(WHOLE, [gpu_uuid(0), gpu_uuid(1)], flags(deviceListStrategy="volume-mounts"))
    assert a.envs == {"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"}
    assert a.mounts == (
        Mount(f"/var/run/nvidia-container-devices/{gpu_uuid(0)}", "/dev/null"),
        Mount(f"/var/run/nvidia-container-devices/{gpu_uuid(1)}", "/dev/null"),
    )


def test_cdi_annotations_with_custom_prefix_and_stable_key() -> None:
    f = flags(deviceListStrategy=["cdi-annotations"], cdiAnnotationPrefix="cdi.example.com/")
    a = allocate(WHOLE, [gpu_uuid(0), gpu_uuid(1)], f)
    ((key, value),) = a.annotations.items()
    assert key.startswith("cdi.example.com/nvidia-device-plugin_")
    assert value == f"nvidia.com/gpu={gpu_uuid(0)},nvidia.com/gpu={gpu_uuid(1)}"
    assert a.envs == {} and a.mounts == () and a.cdi_devices == ()
    assert allocate(WHOLE, [gpu_uuid(0), gpu_uuid(1)], f).annotations == a.annotations
    b = allocate(WHOLE, [gpu_uuid(0)], f, response_id="r1")
    assert b.annotations == {
        "cdi.example.com/nvidia-device-plugin_r1": f"nvidia.com/gpu={gpu_uuid(0)}"
    }


def test_cdi_cri_and_envvar_together() -> None:
    f = flags(deviceListStrategy=["envvar", "cdi-cri"], deviceIDStrategy="index")
    a = allocate(SHARED, [f"{gpu_uuid(1)}::0"], f)
    assert a.cdi_devices == ("nvidia.com/gpu=1",)
    assert a.envs == {"NVIDIA_VISIBLE_DEVICES": "1"}


def test_pass_device_specs_whole_gpus() -> None:
    f = config(flags={"nvidiaDevRoot": "/host", "plugin": {"passDeviceSpecs": True}}).flags
    a = allocate(
        SHARED, [f"{gpu_uuid(1)}::0", f"{gpu_uuid(1)}::1"], f, control_nodes=["/dev/nvidiactl"]
    )
    assert a.devices == (
        DeviceSpec("/dev/nvidiactl", "/host/dev/nvidiactl", "rw"),
        DeviceSpec("/dev/nvidia1", "/host/dev/nvidia1", "rw"),
    )


def test_pass_device_specs_mig_device_adds_capability_nodes() -> None:
    inv = node(gpu(0), gpu(3, migs=("1g.10gb", "1g.10gb")))
    cfg = config(flags={"migStrategy": "mixed", "plugin": {"passDeviceSpecs": True}})
    res = plan(cfg, inv).resource("nvidia.com/mig-1g.10gb")
    assert res is not None
    a = allocate(res, [mig_uuid(3, 1)], cfg.flags)
    paths = [s.container_path for s in a.devices]
    assert paths == [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia-modeset",
        "/dev/nvidia3",
        *mig_capability_paths(3, 2, 0),
    ]


def test_mps_pipe_and_shm() -> None:
    cfg = mps({"name": "gpu", "replicas": 2})
    res = plan(cfg, INV).resources[0]
    a = allocate(res, [f"{gpu_uuid(0)}::1"], cfg.flags)
    assert a.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/nvidia.com/gpu/pipe"
    assert a.envs["NVIDIA_VISIBLE_DEVICES"] == gpu_uuid(0)
    assert a.mounts == (
        Mount("/mps/nvidia.com/gpu/pipe", "/run/nvidia/mps/nvidia.com/gpu/pipe"),
        Mount("/dev/shm", "/run/nvidia/mps/shm"),
    )


def test_unknown_ids_are_refused_with_the_reference_wording() -> None:
    with pytest.raises(AllocationError) as err:
        allocate(SHARED, [f"{gpu_uuid(0)}::0", "GPU-nope"], flags())
    assert str(err.value) == (
        'invalid allocation request for "nvidia.com/gpu": unknown device: GPU-nope'
    )


def test_more_than_one_replica_refused_when_configured() -> None:
    cfg = time_slicing({"name": "gpu", "replicas": 2}, failRequestsGreaterThanOne=True)
    res = plan(cfg, INV).resources[0]
    assert allocate(res, [f"{gpu_uuid(0)}::0"], cfg.flags).physical == (gpu_uuid(0),)
    with pytest.raises(AllocationError) as err:
        allocate(res, [f"{gpu_uuid(0)}::0", f"{gpu_uuid(1)}::0"], cfg.flags)
    assert str(err.value) == (
        'invalid allocation request for "nvidia.com/gpu": maximum request size for shared '
        "resources is 1; found 2"
    )
    # Without the option, several replicas are fine.
    assert len(allocate(SHARED, [f"{gpu_uuid(0)}::0", f"{gpu_uuid(1)}::0"], flags()).physical) == 2


def test_gds_and_mofed() -> None:
    f = config(flags={"gdsEnabled": True, "mofedEnabled": True}).flags
    a = allocate(WHOLE, [gpu_uuid(0)], f)
    assert a.envs["NVIDIA_GDS"] == "enabled" and a.envs["NVIDIA_MOFED"] == "enabled"
