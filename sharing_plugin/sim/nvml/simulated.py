"""A simulated pynvml: the same functions, constants and errors, backed by a node description.

The NVML adapter takes the pynvml module as a value (an `NvmlApi`); handing it a `SimulatedNvml`
instead makes the production adapter code run against pretend GPUs, unchanged. It implements
exactly that surface, with pynvml's own constant values, structures and exception class (mypy
checks it wherever it is handed on as an `NvmlApi`), plus what tests and node files use to
inject faults. Return values use pynvml's ctypes structures where they hold no handles; where
NVML returns handles inside a structure, a plain object with the same field names is returned.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import pynvml

from sharing_plugin.errors import ConfigError, Problem
from sharing_plugin.nvml.api import DeviceHandle, EventSetHandle
from sharing_plugin.sim.nvml.faults import FaultFeed, SimEventData, SimEventSet
from sharing_plugin.sim.nvml.identity import SimIdentity, compute_capability
from sharing_plugin.sim.nvml.limits import SimMemoryLimits
from sharing_plugin.sim.nvml.mig import SimMigOps
from sharing_plugin.sim.nvml.node import (
    Fault,
    LoadedNode,
    load_node_file,
    load_preset,
    read_driver_loaded,
)
from sharing_plugin.sim.nvml.processes import SimProcesses
from sharing_plugin.sim.nvml.state import (
    NO_ID,
    SimComputeInstance,
    SimGpu,
    build_gpus,
    nvml_error,
)
from sharing_plugin.sim.nvml.workload import file_stamp

log = logging.getLogger(__name__)

XID_GPU_FELL_OFF_THE_BUS = 79
_ECC_EVENT_TYPE = {
    "double": int(pynvml.nvmlEventTypeDoubleBitEccError),
    "single": int(pynvml.nvmlEventTypeSingleBitEccError),
}
# What every simulated GPU reports: datacenter GPUs with ECC on.
SUPPORTED_EVENT_TYPES = (
    int(pynvml.nvmlEventTypeXidCriticalError)
    | int(pynvml.nvmlEventTypeDoubleBitEccError)
    | int(pynvml.nvmlEventTypeSingleBitEccError)
)
CUDA_DRIVER_VERSION = 12040


@dataclass(frozen=True, slots=True)
class SimMemory:
    total: int
    free: int
    used: int


class SimulatedNvml(SimMigOps, SimMemoryLimits, SimIdentity):
    """A stand-in for the `pynvml` module, built from a node description."""

    NVMLError: type[Exception] = pynvml.NVMLError
    NVML_ERROR_FUNCTION_NOT_FOUND: int = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    NVML_ERROR_INVALID_ARGUMENT: int = pynvml.NVML_ERROR_INVALID_ARGUMENT
    NVML_ERROR_NOT_FOUND: int = pynvml.NVML_ERROR_NOT_FOUND
    NVML_ERROR_NOT_SUPPORTED: int = pynvml.NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_TIMEOUT: int = pynvml.NVML_ERROR_TIMEOUT
    NVML_DEVICE_MIG_DISABLE: int = pynvml.NVML_DEVICE_MIG_DISABLE
    NVML_DEVICE_MIG_ENABLE: int = pynvml.NVML_DEVICE_MIG_ENABLE
    NVML_GPU_INSTANCE_PROFILE_COUNT: int = pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED: int = (
        pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
    )
    NVML_NVLINK_MAX_LINKS: int = pynvml.NVML_NVLINK_MAX_LINKS
    nvmlEventTypeXidCriticalError: int = pynvml.nvmlEventTypeXidCriticalError
    nvmlEventTypeDoubleBitEccError: int = pynvml.nvmlEventTypeDoubleBitEccError
    nvmlEventTypeSingleBitEccError: int = pynvml.nvmlEventTypeSingleBitEccError
    c_nvmlGpuInstancePlacement_t: type[ctypes.Structure] = pynvml.c_nvmlGpuInstancePlacement_t

    def __init__(self, node: LoadedNode, *, mig_mode_needs_reset: bool = False) -> None:
        try:
            gpus, warnings = build_gpus(node)
        except ValueError as exc:
            source = str(node.path) if node.path is not None else f"preset {node.identity}"
            raise ConfigError([Problem(path="gpus", message=str(exc), file=source)]) from exc
        SimMigOps.__init__(self, gpus, mig_mode_needs_reset=mig_mode_needs_reset)
        SimMemoryLimits.__init__(
            self,
            driver_version=node.description.driver_version,
            cgroup_version=node.description.cgroup_version,
        )
        self.warnings: tuple[str, ...] = tuple(warnings)
        self._lock = threading.Lock()
        # Notified when the last nvmlInit has had its nvmlShutdown, for an observer to wait on.
        self._shut_down = threading.Condition(self._lock)
        self._event_sets: list[SimEventSet] = []
        self._node_path = node.path
        self._driver_loaded = node.description.driver_loaded
        self._driver_stamp = file_stamp(node.path)
        for fault in node.description.faults:
            if fault.lost is not None:
                self._set_lost(fault)  # lost GPUs are state; earlier Xids are history
        self._feed = (
            FaultFeed(node.path, node.description.faults, self.inject)
            if node.path is not None
            else None
        )
        self.processes = SimProcesses(gpus, node)

    @classmethod
    def from_preset(cls, name: str) -> Self:
        return cls(load_preset(name))

    @classmethod
    def from_file(cls, path: Path) -> Self:
        return cls(load_node_file(path))

    # ---- faults: what tests and node files inject ----

    def inject(self, fault: Fault) -> None:
        """Deliver one fault now: an Xid or ECC error event, or a GPU lost (Xid 79) / back."""
        if fault.lost is not None:
            self._set_lost(fault)
            return
        target = self._resolve_fault_target(fault.gpu)
        if target is None:
            log.warning("simulated NVML: fault names no known device: %r", fault.gpu)
            return
        gpu, gi_id, ci_id = target
        if fault.ecc is not None:
            # NVML fills eventData and the instance ids for Xid events only.
            self._emit(gpu, 0, NO_ID, NO_ID, event_type=_ECC_EVENT_TYPE[fault.ecc])
            return
        self._emit(gpu, fault.xid or 0, gi_id, ci_id)

    def _set_lost(self, fault: Fault) -> None:
        target = self._resolve_fault_target(fault.gpu)
        if target is None:
            log.warning("simulated NVML: fault names no known GPU: %r", fault.gpu)
            return
        gpu = target[0]
        was_lost, gpu.lost = gpu.lost, bool(fault.lost)
        if gpu.lost and not was_lost:
            self._emit(gpu, XID_GPU_FELL_OFF_THE_BUS, NO_ID, NO_ID)

    def _resolve_fault_target(self, ref: int | str) -> tuple[SimGpu, int, int] | None:
        for gpu in self.gpus:
            if ref in (gpu.index, gpu.uuid):
                return gpu, NO_ID, NO_ID
            for ci in gpu.mig_devices():
                if ref == ci.uuid:
                    return gpu, ci.gpu_instance.id, ci.id
        return None

    def _emit(
        self,
        gpu: SimGpu,
        xid: int,
        gi_id: int,
        ci_id: int,
        *,
        event_type: int = int(pynvml.nvmlEventTypeXidCriticalError),
    ) -> None:
        event = SimEventData(DeviceHandle(gpu), event_type, xid, gi_id, ci_id)
        with self._lock:
            sets = list(self._event_sets)
        for event_set in sets:
            event_set.offer(gpu.index, event)

    # ---- library ----

    def nvmlInit(self) -> None:
        with self._lock:
            self._follow_driver()
            if not self._driver_loaded:
                raise nvml_error(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
            self._init_count += 1

    def _follow_driver(self) -> None:
        """`driverLoaded` as the node file says now: each nvmlInit looks (a stat, and a read
        only when the file changed), so an edit is seen by the next init, with no watch."""
        stamp = file_stamp(self._node_path)
        if self._node_path is None or stamp == self._driver_stamp:
            return
        loaded = read_driver_loaded(self._node_path)
        if loaded is not None:  # half-written: look again at the next init
            self._driver_stamp = stamp
            self._driver_loaded = loaded

    def nvmlShutdown(self) -> None:
        with self._lock:
            if self._init_count == 0:
                raise nvml_error(pynvml.NVML_ERROR_UNINITIALIZED)
            self._init_count -= 1
            if self._init_count == 0:
                self._shut_down.notify_all()

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check_init()
        return self.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._check_init()
        return CUDA_DRIVER_VERSION

    # ---- devices ----

    def nvmlDeviceGetCount(self) -> int:
        self._check_init()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> DeviceHandle:
        self._check_init()
        if not 0 <= index < len(self.gpus):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[index]
        gpu.check_alive()
        return DeviceHandle(gpu)

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> DeviceHandle:
        self._check_init()
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        for gpu in self.gpus:
            if gpu.uuid == text:
                gpu.check_alive()
                return DeviceHandle(gpu)
            for ci in gpu.mig_devices():
                if ci.uuid == text:
                    gpu.check_alive()
                    return DeviceHandle(ci)
        raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetName(self, handle: object) -> str:
        if isinstance(handle, SimComputeInstance):
            gpu = self._alive(handle.gpu_instance.gpu)
            return f"{gpu.product} MIG {handle.gpu_instance.spec.name}"
        return self._gpu(handle).product

    def nvmlDeviceGetUUID(self, handle: object) -> str:
        if isinstance(handle, SimComputeInstance):
            self._alive(handle.gpu_instance.gpu)
            return handle.uuid
        return self._gpu(handle).uuid

    def nvmlDeviceGetMemoryInfo(self, handle: object) -> SimMemory:
        device = self._device(handle)
        if isinstance(device, SimComputeInstance):
            total = device.gpu_instance.spec.memory_mib << 20
        else:
            total = device.memory_mib << 20
        used = min(self.processes.memory_used(device), total)
        return SimMemory(total=total, free=total - used, used=used)

    def nvmlDeviceGetMinorNumber(self, handle: object) -> int:
        # MIG devices have no /dev/nvidiaN node of their own (they are reached through
        # /dev/nvidia-caps), so NVML reports no minor number for them.
        if isinstance(handle, SimComputeInstance):
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self._gpu(handle).index

    def nvmlDeviceGetPciInfo(self, handle: object) -> pynvml.nvmlPciInfo_t:
        return _pci_info(self._gpu(handle).pci_bus_id)

    def nvmlDeviceGetNumaNodeId(self, handle: object) -> int:
        gpu = self._gpu(handle)
        if gpu.numa_node is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.numa_node

    def nvmlDeviceGetCudaComputeCapability(self, handle: object) -> tuple[int, int]:
        return compute_capability(self._gpu(handle))

    # ---- NVLink and PCIe topology ----

    def nvmlDeviceGetNvLinkState(self, handle: object, link: int) -> int:
        return int(self._nvlink_peer(handle, link) is not None)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: object, link: int) -> pynvml.nvmlPciInfo_t:
        peer = self._nvlink_peer(handle, link)
        if peer is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        return _pci_info(self.gpus[peer].pci_bus_id)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: object, link: int) -> int:
        # Simulated NVLinks join GPUs directly; there are no NVSwitches.
        if self._nvlink_peer(handle, link) is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        return int(pynvml.NVML_NVLINK_DEVICE_TYPE_GPU)

    def _nvlink_peer(self, handle: object, link: int) -> int | None:
        gpu = self._gpu(handle)
        if not gpu.nvlink_peers:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < len(gpu.nvlink_peers):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.nvlink_peers[link]

    def nvmlDeviceGetTopologyCommonAncestor(self, device1: object, device2: object) -> int:
        a, b = self._gpu(device1), self._gpu(device2)
        if a is b:
            return int(pynvml.NVML_TOPOLOGY_INTERNAL)
        if a.numa_node == b.numa_node:
            return int(pynvml.NVML_TOPOLOGY_NODE)
        return int(pynvml.NVML_TOPOLOGY_SYSTEM)

    # ---- processes ----

    def nvmlDeviceGetComputeRunningProcesses(self, handle: object) -> list[Any]:
        return self.processes.running(self._device(handle), mps=False)

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: object) -> list[Any]:
        return self.processes.running(self._device(handle), mps=True)

    def nvmlDeviceGetProcessUtilization(self, handle: object, timeStamp: int) -> Sequence[Any]:
        return self.processes.utilization(
            self._device(handle), timeStamp, call="nvmlDeviceGetProcessUtilization"
        )

    def nvmlDeviceGetProcessesUtilizationInfo(
        self, handle: object, timeStamp: int
    ) -> Sequence[Any]:
        return self.processes.utilization(
            self._device(handle), timeStamp, call="nvmlDeviceGetProcessesUtilizationInfo"
        )

    def _device(self, handle: object) -> SimGpu | SimComputeInstance:
        """A GPU or MIG device handle, checked as NVML checks it."""
        if isinstance(handle, SimComputeInstance):
            self._alive(handle.gpu_instance.gpu)
            return handle
        return self._gpu(handle)

    # ---- events ----

    def nvmlDeviceGetSupportedEventTypes(self, handle: object) -> int:
        self._gpu(handle)
        return SUPPORTED_EVENT_TYPES

    def nvmlEventSetCreate(self) -> EventSetHandle:
        self._check_init()
        event_set = SimEventSet(self._feed.check if self._feed is not None else _nothing)
        with self._lock:
            self._event_sets.append(event_set)
        if self._feed is not None:
            self._feed.start()
        return EventSetHandle(event_set)

    def nvmlDeviceRegisterEvents(self, handle: object, eventTypes: int, eventSet: object) -> None:
        if isinstance(handle, SimComputeInstance):
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)  # events register on the GPU
        gpu = self._gpu(handle)
        if not isinstance(eventSet, SimEventSet) or eventSet.freed:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if eventTypes & ~self.nvmlDeviceGetSupportedEventTypes(handle):
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)  # as NVML does for such a mask
        eventSet.register(gpu.index, eventTypes)

    def nvmlEventSetWait_v2(self, eventSet: object, timeoutms: int) -> SimEventData:
        self._check_init()
        if not isinstance(eventSet, SimEventSet) or eventSet.freed:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return eventSet.wait(timeoutms)

    def nvmlEventSetFree(self, eventSet: object) -> None:
        if not isinstance(eventSet, SimEventSet):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        eventSet.freed = True
        with self._lock:
            registered = eventSet in self._event_sets
            if registered:
                self._event_sets.remove(eventSet)
        if registered and self._feed is not None:
            self._feed.stop()


def _pci_info(bus_id: str) -> pynvml.nvmlPciInfo_t:
    info = pynvml.nvmlPciInfo_t()
    domain, bus, rest = bus_id.split(":")
    info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16)
    info.busId = bus_id.encode()
    info.busIdLegacy = bus_id[4:].encode()
    return info


def _nothing() -> None:
    return None
