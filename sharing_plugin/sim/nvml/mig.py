"""The MIG half of the simulated pynvml: modes, profiles, placements, GPU and compute instances.

Creation follows the model's placement table exactly as the driver does (allowed starts, no
overlap, per-profile and per-GPU counts, a single "+me" instance), so a layout the simulator
accepts is one a real GPU accepts. Only creation with an explicit placement is offered: the
plugin never leaves the start to the driver. Every create/destroy/mode call ends in
`_mig_call_ended`, which does nothing here: the tests' recording simulator keeps the calls.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from typing import Any

import pynvml

from sharing_plugin.gpus.catalog import MigModel, MigProfileSpec
from sharing_plugin.nvml.api import ComputeInstanceHandle, DeviceHandle, GpuInstanceHandle
from sharing_plugin.sim.nvml.state import (
    SimComputeInstance,
    SimGpu,
    SimGpuInstance,
    add_compute_instance,
    add_gpu_instance,
    nvml_error,
    placement_problem,
)

# NVML_COMPUTE_INSTANCE_PROFILE_* index -> compute slices it spans (nvml.h).
_CI_SLICES = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7, 5: 8, 6: 6}


@dataclass(frozen=True, slots=True)
class SimInstanceInfo:
    """nvmlGpuInstanceGetInfo / nvmlComputeInstanceGetInfo (their structs hold handles, which
    the plugin does not read)."""

    id: int
    profileId: int
    placement: pynvml.c_nvmlGpuInstancePlacement_t


class SimMigOps:
    """MIG functions of the simulated pynvml over `gpus`."""

    def __init__(self, gpus: list[SimGpu], *, mig_mode_needs_reset: bool) -> None:
        self.gpus = gpus
        self.mig_mode_needs_reset = mig_mode_needs_reset
        self._init_count = 0
        self._mig_lock = threading.Lock()

    # ---- checks shared with the device functions ----

    def _check_init(self) -> None:
        if self._init_count == 0:
            raise nvml_error(pynvml.NVML_ERROR_UNINITIALIZED)

    def _alive(self, gpu: SimGpu) -> SimGpu:
        self._check_init()
        gpu.check_alive()
        return gpu

    def _gpu(self, handle: object) -> SimGpu:
        self._check_init()
        if not isinstance(handle, SimGpu):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._alive(handle)

    def _mig_gpu(self, handle: object) -> tuple[SimGpu, MigModel]:
        gpu = self._gpu(handle)
        if gpu.mig is None or not gpu.mig_current:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu, gpu.mig

    def _gi(self, handle: object) -> SimGpuInstance:
        self._check_init()
        if not isinstance(handle, SimGpuInstance) or handle not in handle.gpu.gpu_instances:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._alive(handle.gpu)
        return handle

    def _mig_call_ended(
        self, op: str, gpu: SimGpu, spec: MigProfileSpec | None, start: int | None, code: int
    ) -> None:
        """A MIG-changing call (`op`: "create_gpu_instance", "set_mig_mode", ...) ended with
        NVML return `code`. The hook the tests' recording simulator keeps its log through."""

    # ---- MIG mode ----

    def nvmlDeviceGetMigMode(self, handle: object) -> list[int]:
        gpu = self._gpu(handle)
        if gpu.mig is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [int(gpu.mig_current), int(gpu.mig_pending)]

    def nvmlDeviceSetMigMode(self, handle: object, mode: int) -> int:
        gpu = self._gpu(handle)
        if gpu.mig is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not mode and gpu.gpu_instances:
            # The driver refuses to leave MIG mode while GPU instances exist.
            self._mig_call_ended("set_mig_mode", gpu, None, None, pynvml.NVML_ERROR_IN_USE)
            raise nvml_error(pynvml.NVML_ERROR_IN_USE)
        gpu.mig_pending = bool(mode)
        if not self.mig_mode_needs_reset:
            gpu.mig_current = gpu.mig_pending  # an idle GPU is reset by the driver right away
        self._mig_call_ended("set_mig_mode", gpu, None, None, pynvml.NVML_SUCCESS)
        return int(pynvml.NVML_SUCCESS)

    # ---- MIG devices ----

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: object) -> int:
        gpu = self._gpu(handle)
        # nvml.h: "Returns zero if MIG is not supported or enabled."
        return gpu.mig.compute_slices if gpu.mig is not None and gpu.mig_current else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: object, index: int) -> DeviceHandle:
        gpu, mig = self._mig_gpu(handle)
        if not 0 <= index < mig.compute_slices:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        devices = gpu.mig_devices()
        if index >= len(devices):
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        return DeviceHandle(devices[index])

    def _mig_device(self, handle: object) -> SimComputeInstance:
        self._check_init()
        if isinstance(handle, SimGpu):
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not isinstance(handle, SimComputeInstance):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._alive(handle.gpu_instance.gpu)
        return handle

    def nvmlDeviceGetGpuInstanceId(self, handle: object) -> int:
        return self._mig_device(handle).gpu_instance.id

    def nvmlDeviceGetComputeInstanceId(self, handle: object) -> int:
        return self._mig_device(handle).id

    # ---- GPU-instance profiles and placements ----

    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, handle: object, profile: int
    ) -> pynvml.c_nvmlGpuInstanceProfileInfo_v2_t:
        gpu = self._gpu(handle)
        if not 0 <= profile < pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        spec = gpu.mig.profile_by_id(profile) if gpu.mig is not None else None
        if spec is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
        info.id = spec.profile_info_id
        info.isP2pSupported = 0
        info.sliceCount = spec.compute_slices
        info.instanceCount = spec.max_count
        info.multiprocessorCount = spec.sm_count
        info.memorySizeMB = spec.memory_mib
        info.name = f"MIG {spec.name}".encode()
        return info

    def _spec_by_info_id(self, gpu: SimGpu, profile_id: int) -> MigProfileSpec:
        spec = gpu.mig.profile_by_info_id(profile_id) if gpu.mig is not None else None
        if spec is None:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return spec

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self,
        handle: object,
        profileId: int,
        placementsRef: object,
        countRef: object,
    ) -> int:
        # _v2 semantics: every placement of the profile, occupied or not.
        gpu = self._gpu(handle)
        if gpu.mig is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        spec = self._spec_by_info_id(gpu, profileId)
        count = _deref(countRef)
        if placementsRef is not None:
            placements = _deref(placementsRef)
            if len(placements) < len(spec.starts):
                raise nvml_error(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
            for slot, start in zip(placements, spec.starts, strict=False):
                slot.start, slot.size = start, spec.memory_slices
        count.value = len(spec.starts)
        return int(pynvml.NVML_SUCCESS)

    # ---- GPU instances ----

    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self,
        handle: object,
        profileId: int,
        placement: object,
    ) -> GpuInstanceHandle:
        gpu, _ = self._mig_gpu(handle)
        spec = self._spec_by_info_id(gpu, profileId)
        wanted = _deref(placement)
        start = int(wanted.start)
        with self._mig_lock:
            taken = [(gi.spec, gi.start) for gi in gpu.gpu_instances]
            code = (
                pynvml.NVML_ERROR_INVALID_ARGUMENT
                if int(wanted.size) != spec.memory_slices
                else placement_problem(gpu, spec, start, existing=taken)
            )
            if code is not None:
                self._mig_call_ended("create_gpu_instance", gpu, spec, start, code)
                raise nvml_error(code)
            gi = add_gpu_instance(gpu, spec, start)
            self._mig_call_ended("create_gpu_instance", gpu, spec, start, pynvml.NVML_SUCCESS)
            return GpuInstanceHandle(gi)

    def nvmlDeviceGetGpuInstanceById(self, handle: object, gpuInstanceId: int) -> GpuInstanceHandle:
        gpu, _ = self._mig_gpu(handle)
        found = next((gi for gi in gpu.gpu_instances if gi.id == gpuInstanceId), None)
        if found is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        return GpuInstanceHandle(found)

    def nvmlGpuInstanceGetInfo(self, gpuInstance: object) -> SimInstanceInfo:
        gi = self._gi(gpuInstance)
        placement = pynvml.c_nvmlGpuInstancePlacement_t(gi.start, gi.spec.memory_slices)
        return SimInstanceInfo(gi.id, gi.spec.profile_info_id, placement)

    def nvmlGpuInstanceDestroy(self, gpuInstance: object) -> int:
        gi = self._gi(gpuInstance)
        with self._mig_lock:
            if gi.compute_instances:
                self._mig_call_ended(
                    "destroy_gpu_instance", gi.gpu, gi.spec, gi.start, pynvml.NVML_ERROR_IN_USE
                )
                raise nvml_error(pynvml.NVML_ERROR_IN_USE)
            gi.gpu.gpu_instances.remove(gi)
            self._mig_call_ended(
                "destroy_gpu_instance", gi.gpu, gi.spec, gi.start, pynvml.NVML_SUCCESS
            )
        return int(pynvml.NVML_SUCCESS)

    # ---- compute instances ----

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self,
        gpuInstance: object,
        profile: int,
        engProfile: int,
    ) -> pynvml.c_nvmlComputeInstanceProfileInfo_v2_t:
        gi = self._gi(gpuInstance)
        slices = _CI_SLICES.get(profile)
        # nvml.h: the profiles are enumerated "until the API returns INVALID_ARGUMENT"; a
        # profile within the range that this GPU instance cannot hold is NOT_SUPPORTED.
        if not 0 <= profile < pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if engProfile != pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if slices is None or slices > gi.spec.compute_slices:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info = pynvml.c_nvmlComputeInstanceProfileInfo_v2_t()
        info.id = profile
        info.sliceCount = slices
        info.instanceCount = gi.spec.compute_slices // slices
        info.multiprocessorCount = gi.spec.sm_count * slices // gi.spec.compute_slices
        whole = slices == gi.spec.compute_slices
        info.name = (f"MIG {gi.spec.name}" if whole else f"MIG {slices}c.{gi.spec.name}").encode()
        return info

    def nvmlGpuInstanceCreateComputeInstance(
        self,
        gpuInstance: object,
        profileId: int,
    ) -> ComputeInstanceHandle:
        gi = self._gi(gpuInstance)
        slices = _CI_SLICES.get(profileId)
        if slices is None or slices > gi.spec.compute_slices:
            # nvml.h: NOT_SUPPORTED "if profileId isn't supported".
            code = pynvml.NVML_ERROR_NOT_SUPPORTED
            self._mig_call_ended("create_compute_instance", gi.gpu, gi.spec, gi.start, code)
            raise nvml_error(code)
        with self._mig_lock:
            used = sum(ci.slices for ci in gi.compute_instances)
            if used + slices > gi.spec.compute_slices:
                code = pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
                self._mig_call_ended("create_compute_instance", gi.gpu, gi.spec, gi.start, code)
                raise nvml_error(code)
            ci = add_compute_instance(gi, profileId, slices)
            self._mig_call_ended("create_compute_instance", gi.gpu, gi.spec, gi.start, 0)
            return ComputeInstanceHandle(ci)

    def nvmlGpuInstanceGetComputeInstanceById(
        self,
        gpuInstance: object,
        computeInstanceId: int,
    ) -> ComputeInstanceHandle:
        gi = self._gi(gpuInstance)
        found = next((c for c in gi.compute_instances if c.id == computeInstanceId), None)
        if found is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        return ComputeInstanceHandle(found)

    def _ci(self, handle: object) -> SimComputeInstance:
        self._check_init()
        if (
            not isinstance(handle, SimComputeInstance)
            or handle not in handle.gpu_instance.compute_instances
        ):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._alive(handle.gpu_instance.gpu)
        return handle

    def nvmlComputeInstanceGetInfo(self, computeInstance: object) -> SimInstanceInfo:
        ci = self._ci(computeInstance)
        placement = pynvml.c_nvmlGpuInstancePlacement_t(ci.start, ci.slices)
        return SimInstanceInfo(ci.id, ci.profile_id, placement)

    def nvmlComputeInstanceDestroy(self, computeInstance: object) -> int:
        ci = self._ci(computeInstance)
        gi = ci.gpu_instance
        with self._mig_lock:
            gi.compute_instances.remove(ci)
            self._mig_call_ended("destroy_compute_instance", gi.gpu, gi.spec, gi.start, 0)
        return int(pynvml.NVML_SUCCESS)


def _deref(ref: object) -> Any:
    """The object behind a ctypes ``byref(...)``/``pointer(...)`` argument, or `ref` itself."""
    if hasattr(ref, "_obj"):
        return ref._obj
    if isinstance(ref, ctypes._Pointer):
        return ref.contents
    return ref
