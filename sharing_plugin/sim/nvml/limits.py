"""Per-cgroup GPU memory limits as NVML R615 keeps them: `nvmlDeviceSetMemoryLimits_v1` and
`nvmlDeviceGetMemoryLimits_v1`.

A limit belongs to one (GPU, cgroup path) pair. A driver older than R615 has no such symbol
(pynvml then raises FUNCTION_NOT_FOUND, as it does for any function the loaded library lacks); a
MIG device handle, or a node on cgroup v1, answers NOT_SUPPORTED (their memory is isolated
otherwise, or NVML cannot name the cgroup); an empty or relative namespace, or a soft limit above
the hard one, INVALID_ARGUMENT. A cgroup never limited reads back as `NVML_DEVICE_MEMORY_LIMIT_MAX`
for both limits. `currentUsed` is 0: the simulated processes name no cgroup.

The structures are pynvml's where the installed nvidia-ml-py has them, else the same fields
declared here, so the simulator offers the newest surface on the oldest supported bindings.
"""

from __future__ import annotations

import ctypes
import threading

import pynvml

from sharing_plugin.plan.caps import FIRST_DRIVER, driver_major
from sharing_plugin.sim.nvml.state import SimComputeInstance, SimGpu, nvml_error

LIMIT_MAX = 0xFFFFFFFFFFFFFFFF  # NVML_DEVICE_MEMORY_LIMIT_MAX: no limit


class _SetLimits(ctypes.Structure):
    _fields_ = [
        ("nameSpace", ctypes.c_char_p),
        ("softLimit", ctypes.c_ulonglong),
        ("hardLimit", ctypes.c_ulonglong),
    ]


class _GetLimits(ctypes.Structure):
    _fields_ = [
        ("nameSpace", ctypes.c_char_p),
        ("softLimit", ctypes.c_ulonglong),
        ("hardLimit", ctypes.c_ulonglong),
        ("currentUsed", ctypes.c_ulonglong),
    ]


SET_LIMITS: type[ctypes.Structure] = getattr(pynvml, "c_nvmlSetMemoryLimits_v1_t", _SetLimits)
GET_LIMITS: type[ctypes.Structure] = getattr(pynvml, "c_nvmlGetMemoryLimits_v1_t", _GetLimits)


class SimMemoryLimits:
    """The two memory-limit functions over `gpus`, for a driver `driver_version` on cgroup
    `cgroup_version`; `limits` is what was set, for tests to read."""

    NVML_DEVICE_MEMORY_LIMIT_MAX: int = LIMIT_MAX
    c_nvmlSetMemoryLimits_v1_t: type[ctypes.Structure] = SET_LIMITS
    c_nvmlGetMemoryLimits_v1_t: type[ctypes.Structure] = GET_LIMITS

    def __init__(self, *, driver_version: str, cgroup_version: int) -> None:
        self.driver_version = driver_version
        self.cgroup_version = cgroup_version
        self.limits: dict[tuple[str, str], tuple[int, int]] = {}  # (GPU UUID, cgroup) -> limits
        self._limits_lock = threading.Lock()

    def nvmlDeviceSetMemoryLimits_v1(self, handle: object, limits: ctypes.Structure) -> None:
        key = self._key(handle, limits)
        soft, hard = int(limits.softLimit), int(limits.hardLimit)
        if soft > hard:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        with self._limits_lock:
            if soft == hard == LIMIT_MAX:
                self.limits.pop(key, None)
            else:
                self.limits[key] = (soft, hard)

    def nvmlDeviceGetMemoryLimits_v1(self, handle: object, limits: ctypes.Structure) -> None:
        key = self._key(handle, limits)
        with self._limits_lock:
            soft, hard = self.limits.get(key, (LIMIT_MAX, LIMIT_MAX))
        limits.softLimit, limits.hardLimit, limits.currentUsed = soft, hard, 0

    def _key(self, handle: object, limits: ctypes.Structure) -> tuple[str, str]:
        if driver_major(self.driver_version) < FIRST_DRIVER:
            raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        if isinstance(handle, SimComputeInstance) or self.cgroup_version != 2:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not isinstance(handle, SimGpu):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        handle.check_alive()
        raw = limits.nameSpace  # pynvml's structures read a char* back as str
        namespace = raw.decode() if isinstance(raw, bytes) else raw if isinstance(raw, str) else ""
        if not namespace.startswith("/"):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return handle.uuid, namespace
