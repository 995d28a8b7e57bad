"""MIG operations through NVML: create and destroy GPU/compute instances, MIG mode.

Thin on purpose: the decisions (which layout, which instance may go) are the MIG solver's; these
functions only carry them out and translate failures into `NvmlError` with NVML's error name.
GPU instances are always created with an explicit placement, because the driver's own choice
(first free start) depends on creation order and can strand capacity.

Each call opens its own NVML session (NVML counts initialisations, so this is cheap while
another session is open) and addresses GPUs by UUID, which survives re-enumeration.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from sharing_plugin.gpus.inventory import MigUuid
from sharing_plugin.nvml.api import DeviceHandle, GpuInstanceProfileInfo, NvmlApi
from sharing_plugin.nvml.calls import is_code, nvml_errors, nvml_session, text


@dataclass(frozen=True, slots=True)
class MigModeState:
    """A GPU's MIG mode; `pending` differs from `current` until the GPU is reset."""

    current: bool
    pending: bool

    @property
    def reset_required(self) -> bool:
        return self.current != self.pending


@dataclass(frozen=True, slots=True)
class CreatedMigDevice:
    gi_id: int
    ci_id: int
    uuid: MigUuid


def _profile_info(
    nvml: NvmlApi, handle: DeviceHandle, profile_index: int, where: str
) -> GpuInstanceProfileInfo:
    with nvml_errors(nvml, f"{where}: reading GPU-instance profile {profile_index}"):
        return nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile_index)


def _gpu(nvml: NvmlApi, gpu_uuid: str) -> DeviceHandle:
    with nvml_errors(nvml, f"GPU {gpu_uuid}: getting its handle"):
        return nvml.nvmlDeviceGetHandleByUUID(gpu_uuid)


def create_gpu_instance(nvml: NvmlApi, gpu_uuid: str, *, profile_index: int, start: int) -> int:
    """Create a GPU instance of a profile at a placement start; returns its GI id."""
    with nvml_session(nvml):
        handle = _gpu(nvml, gpu_uuid)
        where = f"GPU {gpu_uuid}"
        info = _profile_info(nvml, handle, profile_index, where)
        name = text(info.name).removeprefix("MIG ") or f"profile {profile_index}"
        # The placement size is the profile's memory-slice count: NVML needs it spelled out.
        slices = _memory_slices(nvml, handle, info)
        placement = nvml.c_nvmlGpuInstancePlacement_t(start, slices)
        with nvml_errors(nvml, f"{where}: creating a {name} GPU instance at memory slice {start}"):
            gi = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(
                handle, info.id, ctypes.pointer(placement)
            )
            return int(nvml.nvmlGpuInstanceGetInfo(gi).id)


def _memory_slices(nvml: NvmlApi, handle: DeviceHandle, info: GpuInstanceProfileInfo) -> int:
    placements = (nvml.c_nvmlGpuInstancePlacement_t * 16)()
    count = ctypes.c_uint(len(placements))
    with nvml_errors(nvml, "reading a profile's placement size"):
        nvml.nvmlDeviceGetGpuInstancePossiblePlacements(
            handle, info.id, placements, ctypes.pointer(count)
        )
    return int(placements[0].size) if count.value else 0


def create_compute_instance(
    nvml: NvmlApi, gpu_uuid: str, *, gi_id: int, ci_profile_index: int
) -> CreatedMigDevice:
    """Create the compute instance inside GPU instance `gi_id`; returns the new MIG device."""
    with nvml_session(nvml):
        handle = _gpu(nvml, gpu_uuid)
        where = f"GPU {gpu_uuid} GPU instance {gi_id}"
        with nvml_errors(nvml, f"{where}: creating its compute instance"):
            gi = nvml.nvmlDeviceGetGpuInstanceById(handle, gi_id)
            info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, ci_profile_index, nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
            )
            ci = nvml.nvmlGpuInstanceCreateComputeInstance(gi, info.id)
            ci_id = int(nvml.nvmlComputeInstanceGetInfo(ci).id)
        return CreatedMigDevice(gi_id, ci_id, _mig_uuid(nvml, handle, gi_id, ci_id, where))


def _mig_uuid(nvml: NvmlApi, handle: DeviceHandle, gi_id: int, ci_id: int, where: str) -> MigUuid:
    with nvml_errors(nvml, f"{where}: finding the new MIG device"):
        for slot in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except nvml.NVMLError as exc:
                if is_code(exc, nvml.NVML_ERROR_NOT_FOUND, nvml.NVML_ERROR_INVALID_ARGUMENT):
                    continue
                raise
            ids = (
                int(nvml.nvmlDeviceGetGpuInstanceId(mig)),
                int(nvml.nvmlDeviceGetComputeInstanceId(mig)),
            )
            if ids == (gi_id, ci_id):
                return MigUuid(text(nvml.nvmlDeviceGetUUID(mig)))
        raise nvml.NVMLError(nvml.NVML_ERROR_NOT_FOUND)


def destroy_mig_device(nvml: NvmlApi, gpu_uuid: str, *, gi_id: int, ci_id: int | None) -> None:
    """Destroy a compute instance (if `ci_id` is given) and then its GPU instance.

    NVML refuses to destroy a GPU instance that still holds compute instances (IN_USE), and a
    compute instance with running processes (IN_USE): that error reaches the caller unchanged.
    """
    with nvml_session(nvml):
        handle = _gpu(nvml, gpu_uuid)
        where = f"GPU {gpu_uuid} GPU instance {gi_id}"
        with nvml_errors(nvml, f"{where}: finding it"):
            gi = nvml.nvmlDeviceGetGpuInstanceById(handle, gi_id)
        if ci_id is not None:
            with nvml_errors(nvml, f"{where}: destroying compute instance {ci_id}"):
                nvml.nvmlComputeInstanceDestroy(
                    nvml.nvmlGpuInstanceGetComputeInstanceById(gi, ci_id)
                )
        with nvml_errors(nvml, f"{where}: destroying it"):
            nvml.nvmlGpuInstanceDestroy(gi)


def set_mig_mode(nvml: NvmlApi, gpu_uuid: str, *, enabled: bool) -> MigModeState:
    """Ask for MIG mode on or off; the answer says whether a GPU reset is still needed."""
    with nvml_session(nvml):
        handle = _gpu(nvml, gpu_uuid)
        mode = nvml.NVML_DEVICE_MIG_ENABLE if enabled else nvml.NVML_DEVICE_MIG_DISABLE
        with nvml_errors(nvml, f"GPU {gpu_uuid}: turning MIG mode {'on' if enabled else 'off'}"):
            nvml.nvmlDeviceSetMigMode(handle, mode)
            current, pending = nvml.nvmlDeviceGetMigMode(handle)
        on = int(nvml.NVML_DEVICE_MIG_ENABLE)
        return MigModeState(current=int(current) == on, pending=int(pending) == on)
