"""The NVML surface the plugin uses, as a type: the real `pynvml` and the simulator both fit it.

`NvmlApi` lists exactly the functions, constants and the error class the adapters call, with
pynvml's names and the argument order of its bindings (positional-only, since pynvml's own
parameter names are not part of its contract). Nothing outside this list may be called: a new
call is added here first, where the test that the real module has every member, and mypy's check
that the simulator has them, catch a name that does not exist.

Handles (devices, GPU and compute instances, event sets) are opaque: pynvml hands out ctypes
pointers, the simulator its own state objects, and the adapters only pass them back. Distinct
`NewType`s keep a GPU-instance handle from being passed where a device handle is expected. The
structures NVML fills are described by the fields the adapters read, read-only.

pynvml itself is untyped (mypy sees the module as `Any`), so its conformance is checked at run
time by the unit tests, member by member; the simulator is checked by mypy wherever it is handed
on as an `NvmlApi`.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import NewType, Protocol

DeviceHandle = NewType("DeviceHandle", object)
"""A GPU or a MIG device (``nvmlDevice_t``)."""
GpuInstanceHandle = NewType("GpuInstanceHandle", object)
"""``nvmlGpuInstance_t``."""
ComputeInstanceHandle = NewType("ComputeInstanceHandle", object)
"""``nvmlComputeInstance_t``."""
EventSetHandle = NewType("EventSetHandle", object)
"""``nvmlEventSet_t``."""


class MemoryInfo(Protocol):
    @property
    def total(self) -> int: ...
    @property
    def used(self) -> int: ...


class PciInfo(Protocol):
    @property
    def busId(self) -> str | bytes: ...


class GpuInstanceProfileInfo(Protocol):
    """``nvmlGpuInstanceProfileInfo_v2_t``: `id` is the per-GPU profile id, not the index."""

    @property
    def id(self) -> int: ...
    @property
    def name(self) -> str | bytes: ...
    @property
    def sliceCount(self) -> int: ...
    @property
    def memorySizeMB(self) -> int: ...
    @property
    def multiprocessorCount(self) -> int: ...


class GpuInstancePlacement(Protocol):
    @property
    def start(self) -> int: ...
    @property
    def size(self) -> int: ...


class GpuInstanceInfo(Protocol):
    @property
    def id(self) -> int: ...
    @property
    def profileId(self) -> int: ...
    @property
    def placement(self) -> GpuInstancePlacement: ...


class ComputeInstanceProfileInfo(Protocol):
    @property
    def id(self) -> int: ...


class ComputeInstanceInfo(Protocol):
    @property
    def id(self) -> int: ...


class ProcessInfo(Protocol):
    """``nvmlProcessInfo_t`` as pynvml hands it out (a friendly object with the struct's
    fields): `usedGpuMemory` is None where NVML reports it not available; the instance ids are
    0xFFFFFFFF unless the GPU is in MIG mode."""

    @property
    def pid(self) -> int: ...
    @property
    def usedGpuMemory(self) -> int | None: ...
    @property
    def gpuInstanceId(self) -> int: ...
    @property
    def computeInstanceId(self) -> int: ...


class ProcessUtilizationSample(Protocol):
    """``nvmlProcessUtilizationSample_t``, and the fields ``nvmlProcessUtilizationInfo_v1_t``
    shares with it: percentages over NVML's last sample period, `timeStamp` in CPU
    microseconds."""

    @property
    def pid(self) -> int: ...
    @property
    def timeStamp(self) -> int: ...
    @property
    def smUtil(self) -> int: ...


class EventData(Protocol):
    """``nvmlEventData_t``; `eventData` and the instance ids are filled for Xid events only."""

    @property
    def device(self) -> DeviceHandle: ...
    @property
    def eventType(self) -> int: ...
    @property
    def eventData(self) -> int: ...
    @property
    def gpuInstanceId(self) -> int: ...
    @property
    def computeInstanceId(self) -> int: ...


class NvmlApi(Protocol):
    """What the plugin calls of pynvml."""

    # Every failing call raises an instance of this class; its `value` is the NVML return code.
    NVMLError: type[Exception]

    NVML_ERROR_FUNCTION_NOT_FOUND: int
    NVML_ERROR_INVALID_ARGUMENT: int
    NVML_ERROR_NOT_FOUND: int
    NVML_ERROR_NOT_SUPPORTED: int
    NVML_ERROR_TIMEOUT: int

    NVML_DEVICE_MIG_DISABLE: int
    NVML_DEVICE_MIG_ENABLE: int
    NVML_GPU_INSTANCE_PROFILE_COUNT: int
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED: int
    NVML_NVLINK_MAX_LINKS: int

    nvmlEventTypeXidCriticalError: int
    nvmlEventTypeDoubleBitEccError: int
    nvmlEventTypeSingleBitEccError: int

    # The ctypes structure NVML reads and writes placements in (an array of them is passed to
    # nvmlDeviceGetGpuInstancePossiblePlacements).
    c_nvmlGpuInstancePlacement_t: type[ctypes.Structure]

    # ---- library and system ----

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str | bytes: ...
    def nvmlSystemGetCudaDriverVersion(self) -> int: ...

    # ---- devices ----

    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int, /) -> DeviceHandle: ...
    def nvmlDeviceGetHandleByUUID(self, uuid: str, /) -> DeviceHandle: ...
    def nvmlDeviceGetUUID(self, device: DeviceHandle, /) -> str | bytes: ...
    def nvmlDeviceGetName(self, device: DeviceHandle, /) -> str | bytes: ...
    def nvmlDeviceGetMemoryInfo(self, device: DeviceHandle, /) -> MemoryInfo: ...
    def nvmlDeviceGetMinorNumber(self, device: DeviceHandle, /) -> int: ...
    def nvmlDeviceGetPciInfo(self, device: DeviceHandle, /) -> PciInfo: ...
    def nvmlDeviceGetCudaComputeCapability(self, device: DeviceHandle, /) -> tuple[int, int]: ...
    def nvmlDeviceGetNumaNodeId(self, device: DeviceHandle, /) -> int: ...
    def nvmlDeviceGetArchitecture(self, device: DeviceHandle, /) -> int: ...
    def nvmlDeviceGetBrand(self, device: DeviceHandle, /) -> int: ...

    # ---- NVLink and PCIe topology ----

    def nvmlDeviceGetTopologyCommonAncestor(
        self, device1: DeviceHandle, device2: DeviceHandle, /
    ) -> int: ...
    def nvmlDeviceGetNvLinkState(self, device: DeviceHandle, link: int, /) -> int: ...
    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: DeviceHandle, link: int, /) -> PciInfo: ...
    def nvmlDeviceGetNvLinkRemoteDeviceType(self, device: DeviceHandle, link: int, /) -> int: ...

    # ---- MIG mode and MIG devices ----

    def nvmlDeviceGetMigMode(self, device: DeviceHandle, /) -> list[int]: ...
    def nvmlDeviceSetMigMode(self, device: DeviceHandle, mode: int, /) -> int: ...
    def nvmlDeviceGetMaxMigDeviceCount(self, device: DeviceHandle, /) -> int: ...
    def nvmlDeviceGetMigDeviceHandleByIndex(
        self, device: DeviceHandle, index: int, /
    ) -> DeviceHandle: ...
    def nvmlDeviceGetGpuInstanceId(self, device: DeviceHandle, /) -> int: ...
    def nvmlDeviceGetComputeInstanceId(self, device: DeviceHandle, /) -> int: ...

    # ---- GPU instances ----

    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, device: DeviceHandle, profile: int, /
    ) -> GpuInstanceProfileInfo: ...
    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self,
        device: DeviceHandle,
        profile_id: int,
        placements: ctypes.Array[ctypes.Structure],
        count: ctypes._Pointer[ctypes.c_uint],
        /,
    ) -> int: ...
    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self,
        device: DeviceHandle,
        profile_id: int,
        placement: ctypes._Pointer[ctypes.Structure],
        /,
    ) -> GpuInstanceHandle: ...
    def nvmlDeviceGetGpuInstanceById(
        self, device: DeviceHandle, gi_id: int, /
    ) -> GpuInstanceHandle: ...
    def nvmlGpuInstanceGetInfo(self, gpu_instance: GpuInstanceHandle, /) -> GpuInstanceInfo: ...
    def nvmlGpuInstanceDestroy(self, gpu_instance: GpuInstanceHandle, /) -> int: ...

    # ---- compute instances ----

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, gpu_instance: GpuInstanceHandle, profile: int, engine_profile: int, /
    ) -> ComputeInstanceProfileInfo: ...
    def nvmlGpuInstanceCreateComputeInstance(
        self, gpu_instance: GpuInstanceHandle, profile_id: int, /
    ) -> ComputeInstanceHandle: ...
    def nvmlGpuInstanceGetComputeInstanceById(
        self, gpu_instance: GpuInstanceHandle, ci_id: int, /
    ) -> ComputeInstanceHandle: ...
    def nvmlComputeInstanceGetInfo(
        self, compute_instance: ComputeInstanceHandle, /
    ) -> ComputeInstanceInfo: ...
    def nvmlComputeInstanceDestroy(self, compute_instance: ComputeInstanceHandle, /) -> int: ...

    # ---- processes ----
    # pynvml sizes the buffers (NVML_ERROR_INSUFFICIENT_SIZE, then the real call) itself and
    # returns lists; no running process is an empty list. The utilization calls raise
    # NVML_ERROR_NOT_FOUND when no process had a sample since `timestamp`.

    def nvmlDeviceGetComputeRunningProcesses(
        self, device: DeviceHandle, /
    ) -> Sequence[ProcessInfo]: ...
    def nvmlDeviceGetMPSComputeRunningProcesses(
        self, device: DeviceHandle, /
    ) -> Sequence[ProcessInfo]: ...
    def nvmlDeviceGetProcessUtilization(
        self, device: DeviceHandle, timestamp: int, /
    ) -> Sequence[ProcessUtilizationSample]: ...
    def nvmlDeviceGetProcessesUtilizationInfo(
        self, device: DeviceHandle, timestamp: int, /
    ) -> Sequence[ProcessUtilizationSample]: ...

    # ---- events ----

    def nvmlDeviceGetSupportedEventTypes(self, device: DeviceHandle, /) -> int: ...
    def nvmlEventSetCreate(self) -> EventSetHandle: ...
    def nvmlDeviceRegisterEvents(
        self, device: DeviceHandle, event_types: int, event_set: EventSetHandle, /
    ) -> None: ...
    def nvmlEventSetWait_v2(self, event_set: EventSetHandle, timeout_ms: int, /) -> EventData: ...
    def nvmlEventSetFree(self, event_set: EventSetHandle, /) -> None: ...
