"""A cgroup's GPU memory limit, read and set through NVML (R615's nvmlDevice*MemoryLimits_v1).

The container toolkit's CDI hook sets the limit as a container starts; the usage monitor reads it
back for each process on a capped share and sets it itself where the hook never ran (a runtime
without CDI, an older toolkit). Limits are whole bytes to NVML and whole MiB here, as the hook's
env vars give them. A cgroup never limited reads back as NVML_DEVICE_MEMORY_LIMIT_MAX: no limit.
Bindings older than nvidia-ml-py 13.615 lack the calls, so they are looked up by name rather
than listed in the NVML Protocol (which the oldest supported bindings must satisfy);
`bindings_problem` says when they are missing.

Blocking calls, inside an NVML session the caller holds: call from a worker thread.
"""

from __future__ import annotations

from dataclasses import dataclass

from sharing_plugin.nvml.api import DeviceHandle, NvmlApi
from sharing_plugin.nvml.calls import nvml_errors

MIB = 1 << 20
SET_CALL = "nvmlDeviceSetMemoryLimits_v1"
GET_CALL = "nvmlDeviceGetMemoryLimits_v1"
SET_STRUCT = "c_nvmlSetMemoryLimits_v1_t"
GET_STRUCT = "c_nvmlGetMemoryLimits_v1_t"
_NO_LIMIT = 0xFFFFFFFFFFFFFFFF  # NVML_DEVICE_MEMORY_LIMIT_MAX


@dataclass(frozen=True, slots=True)
class CgroupLimit:
    """One cgroup's limit on one GPU, in MiB (None: no limit), and what it uses there."""

    hard_mib: int | None
    used_mib: int


def bindings_problem(nvml: NvmlApi) -> str | None:
    """Why these NVML bindings cannot read or set limits (None: they can)."""
    missing = [c for c in (SET_CALL, GET_CALL, SET_STRUCT, GET_STRUCT) if not hasattr(nvml, c)]
    if not missing:
        return None
    return f"the NVML bindings lack {', '.join(missing)} (nvidia-ml-py 13.615 or later has them)"


def read_limit(nvml: NvmlApi, handle: DeviceHandle, cgroup: str) -> CgroupLimit:
    """The limit of `cgroup` (its path below the cgroup root, e.g. /kubepods/...) on a GPU."""
    limits = getattr(nvml, GET_STRUCT)()
    limits.nameSpace = cgroup.encode()
    with nvml_errors(nvml, f"reading the GPU memory limit of cgroup {cgroup}"):
        getattr(nvml, GET_CALL)(handle, limits)
    hard = int(limits.hardLimit)
    return CgroupLimit(
        hard_mib=None if hard == _NO_LIMIT else hard // MIB,
        used_mib=int(limits.currentUsed) // MIB,
    )


def set_limit(nvml: NvmlApi, handle: DeviceHandle, cgroup: str, mib: int) -> None:
    """Cap `cgroup` at `mib` on a GPU (soft = hard, as the hook sets request = limit)."""
    limits = getattr(nvml, SET_STRUCT)()
    limits.nameSpace = cgroup.encode()
    limits.softLimit = limits.hardLimit = mib * MIB
    with nvml_errors(nvml, f"setting the GPU memory limit of cgroup {cgroup} to {mib} MiB"):
        getattr(nvml, SET_CALL)(handle, limits)
