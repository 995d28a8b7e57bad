"""MIG operations through the adapter, against the simulated NVML's rules and call record."""

from __future__ import annotations

import pytest
from support.observe import MigCall, RecordingNvml, reset_gpu, set_lost

from sharing_plugin.errors import GpuLostError, NvmlError
from sharing_plugin.gpus.inventory import MigPlacement
from sharing_plugin.nvml.discover import discover
from sharing_plugin.nvml.mig_ops import (
    create_compute_instance,
    create_gpu_instance,
    destroy_mig_device,
    set_mig_mode,
)

GI_1_SLICE, GI_3_SLICE, GI_7_SLICE = 0, 2, 4  # NVML_GPU_INSTANCE_PROFILE_*
CI_3_SLICE = 2  # NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE


def test_create_then_discover_then_destroy() -> None:
    sim = RecordingNvml.from_preset("a100-mig-mixed")
    gpu = discover(sim).gpus[3]  # MIG on, no instances
    assert gpu.mig_enabled and gpu.mig_devices == ()

    gi_id = create_gpu_instance(sim, gpu.uuid, profile_index=GI_3_SLICE, start=4)
    created = create_compute_instance(sim, gpu.uuid, gi_id=gi_id, ci_profile_index=CI_3_SLICE)
    (mig,) = discover(sim).gpus[3].mig_devices
    assert (mig.uuid, mig.gi_id, mig.ci_id) == (created.uuid, created.gi_id, created.ci_id)
    assert (mig.profile, mig.placement) == ("3g.40gb", MigPlacement(4, 4))

    with pytest.raises(NvmlError, match="NVML_ERROR_IN_USE"):  # its compute instance is there
        destroy_mig_device(sim, gpu.uuid, gi_id=gi_id, ci_id=None)
    destroy_mig_device(sim, gpu.uuid, gi_id=gi_id, ci_id=created.ci_id)
    assert discover(sim).gpus[3].mig_devices == ()
    with pytest.raises(NvmlError, match="NVML_ERROR_NOT_FOUND"):
        destroy_mig_device(sim, gpu.uuid, gi_id=gi_id, ci_id=None)

    assert [(c.op, c.gpu, c.profile, c.start, c.result) for c in sim.mig_calls] == [
        ("create_gpu_instance", 3, "3g.40gb", 4, "SUCCESS"),
        ("create_compute_instance", 3, "3g.40gb", 4, "SUCCESS"),
        ("destroy_gpu_instance", 3, "3g.40gb", 4, "NVML_ERROR_IN_USE"),
        ("destroy_compute_instance", 3, "3g.40gb", 4, "SUCCESS"),
        ("destroy_gpu_instance", 3, "3g.40gb", 4, "SUCCESS"),
    ]
    assert all(isinstance(c, MigCall) for c in sim.mig_calls)


def test_a_refused_creation_is_recorded_and_names_the_error() -> None:
    sim = RecordingNvml.from_preset("a100-mig-mixed")
    uuid = sim.gpus[0].uuid  # 3g.40gb@0, 2g.20gb@4, 1g.10gb@6: full
    with pytest.raises(
        NvmlError,
        match=r"creating a 1g.10gb GPU instance at memory slice 6.*"
        "INSUFFICIENT_RESOURCES",
    ):
        create_gpu_instance(sim, uuid, profile_index=GI_1_SLICE, start=6)
    assert sim.mig_calls[-1].result == "NVML_ERROR_INSUFFICIENT_RESOURCES"


def test_gpus_without_mig_refuse_mig_calls() -> None:
    sim = RecordingNvml.from_preset("t4x4")
    uuid = sim.gpus[0].uuid
    with pytest.raises(NvmlError, match="NVML_ERROR_NOT_SUPPORTED"):
        create_gpu_instance(sim, uuid, profile_index=GI_1_SLICE, start=0)
    with pytest.raises(NvmlError, match="NVML_ERROR_NOT_SUPPORTED"):
        set_mig_mode(sim, uuid, enabled=True)


def test_mig_calls_on_a_mig_disabled_gpu_are_not_supported() -> None:
    sim = RecordingNvml.from_preset("dgx-h100")
    with pytest.raises(NvmlError, match="NVML_ERROR_NOT_SUPPORTED"):
        create_gpu_instance(sim, sim.gpus[0].uuid, profile_index=GI_7_SLICE, start=0)


def test_a_lost_gpu_answers_gpu_is_lost() -> None:
    sim = RecordingNvml.from_preset("a100-mig-mixed")
    set_lost(sim, 0)
    with pytest.raises(GpuLostError):
        destroy_mig_device(sim, sim.gpus[0].uuid, gi_id=1, ci_id=0)


def test_mig_mode_takes_effect_at_once_on_an_idle_gpu() -> None:
    sim = RecordingNvml.from_preset("dgx-h100")
    state = set_mig_mode(sim, sim.gpus[0].uuid, enabled=True)
    assert (state.current, state.pending, state.reset_required) == (True, True, False)
    assert discover(sim).gpus[0].mig_enabled


def test_mig_mode_can_stay_pending_until_a_reset() -> None:
    sim = RecordingNvml.from_preset("dgx-h100")
    sim.mig_mode_needs_reset = True
    state = set_mig_mode(sim, sim.gpus[1].uuid, enabled=True)
    assert (state.current, state.pending, state.reset_required) == (False, True, True)
    gpu = discover(sim).gpus[1]
    assert (gpu.mig_enabled, gpu.mig_pending) == (False, True)
    reset_gpu(sim, 1)
    assert discover(sim).gpus[1].mig_enabled


def test_mig_mode_cannot_be_turned_off_under_existing_instances() -> None:
    sim = RecordingNvml.from_preset("a100-mig-mixed")
    with pytest.raises(NvmlError, match="turning MIG mode off: NVML_ERROR_IN_USE"):
        set_mig_mode(sim, sim.gpus[0].uuid, enabled=False)
    assert set_mig_mode(sim, sim.gpus[3].uuid, enabled=False).current is False


def test_the_simulator_answers_as_nvml_h_documents() -> None:
    """Where nvml.h says what a call returns and the simulator once said otherwise."""
    sim = RecordingNvml.from_preset("dgx-h100")  # MIG off
    sim.nvmlInit()
    try:
        handle = sim.nvmlDeviceGetHandleByIndex(0)
        # "Returns zero if MIG is not supported or enabled."
        assert sim.nvmlDeviceGetMaxMigDeviceCount(handle) == 0
        set_mig_mode(sim, sim.gpus[0].uuid, enabled=True)
        assert sim.nvmlDeviceGetMaxMigDeviceCount(handle) == 7
        gi_id = create_gpu_instance(sim, sim.gpus[0].uuid, profile_index=GI_1_SLICE, start=0)
        gi = sim.nvmlDeviceGetGpuInstanceById(handle, gi_id)
        shared = sim.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
        # Past the last profile: INVALID_ARGUMENT, which is how callers find the end.
        with pytest.raises(sim.NVMLError) as past:
            sim.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, 9, shared)
        assert past.value.value == sim.NVML_ERROR_INVALID_ARGUMENT
        # A compute instance larger than its GPU instance: the profile is not supported.
        with pytest.raises(sim.NVMLError) as unsupported:
            sim.nvmlGpuInstanceCreateComputeInstance(gi, CI_3_SLICE)
        assert unsupported.value.value == sim.NVML_ERROR_NOT_SUPPORTED
    finally:
        sim.nvmlShutdown()
    assert sim.mig_calls[-1].result == "NVML_ERROR_NOT_SUPPORTED"
