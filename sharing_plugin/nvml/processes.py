"""Who runs on each GPU: NVML's running processes, their memory and SM utilization.

One `read` walks the inventory's GPUs (blocking: call it from a worker thread). Per GPU it asks
for the running compute processes once, on the GPU's handle: in MIG mode NVML answers for all
its MIG devices, each process carrying its GPU and compute instance ids, which the inventory
maps to the MIG device. GPUs that back an MPS resource are also asked for MPS clients
(nvmlDeviceGetMPSComputeRunningProcesses), since a client of an MPS server is listed there.

Per-process utilization comes from nvmlDeviceGetProcessesUtilizationInfo (R550 and later) or,
where the driver lacks it, nvmlDeviceGetProcessUtilization, asked for the samples of the last
second. NVML returns a sample only for a process that used the SMs, and NOT_FOUND when none
did, so a process without a sample is idle. A GPU where neither call is supported (MIG mode:
NVML does not attribute utilization to processes there) gives memory only; that is said once
in the log per GPU and mode, and the call is not tried on it again while the mode holds.

The adapter keeps one NVML session open between reads (nvmlInit is not free on a real node),
ended by `close`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from sharing_plugin.errors import NvmlError
from sharing_plugin.gpus.inventory import Gpu, Inventory
from sharing_plugin.nvml.api import DeviceHandle, NvmlApi, ProcessInfo, ProcessUtilizationSample
from sharing_plugin.nvml.calls import is_code, nvml_errors, to_nvml_error
from sharing_plugin.usage.model import DeviceMemory, GpuProcess, NvmlUsage

log = logging.getLogger(__name__)

INFO_CALL = "nvmlDeviceGetProcessesUtilizationInfo"
SAMPLE_CALL = "nvmlDeviceGetProcessUtilization"
_WINDOW_S = 1.0


@dataclass(frozen=True, slots=True)
class _Utilization:
    """What a GPU answered for per-process utilization: SM percent by pid, or nothing."""

    by_pid: dict[int, int] | None


class ProcessReader:
    """Reads `NvmlUsage` from NVML; thread-safe, one read at a time."""

    def __init__(self, nvml: NvmlApi, *, clock: Callable[[], float] = time.time) -> None:
        self._nvml = nvml
        self._clock = clock
        self._lock = threading.Lock()
        self._open = False
        self._handles: dict[str, DeviceHandle] = {}
        self._lacking: set[str] = set()  # utilization calls the driver does not have
        # (GPU UUID, MIG mode) -> the utilization call that works there, or None: neither
        self._calls: dict[tuple[str, bool], str | None] = {}

    def read(self, inventory: Inventory, *, mps: Collection[str] = ()) -> NvmlUsage:
        """Every process on the inventory's GPUs; `mps`: the GPUs that back an MPS resource."""
        with self._lock:
            try:
                self._ensure_open()
            except NvmlError as exc:
                return NvmlUsage(problems=(str(exc),))
            processes: list[GpuProcess] = []
            memory: list[DeviceMemory] = []
            problems: list[str] = []
            sampled: set[str] = set()
            for gpu in inventory.gpus:
                try:
                    found, used, answered = self._read_gpu(gpu, mps=gpu.uuid in mps)
                except NvmlError as exc:
                    self._handles.pop(gpu.uuid, None)
                    problems.append(str(exc))
                    continue
                processes += found
                memory.append(used)
                if answered:
                    sampled.add(gpu.uuid)
            return NvmlUsage(
                processes=tuple(processes),
                memory=tuple(memory),
                problems=tuple(problems),
                sampled=frozenset(sampled),
            )

    def close(self) -> None:
        """End the NVML session (blocking)."""
        with self._lock:
            if self._open:
                self._open = False
                self._handles.clear()
                nvml = self._nvml
                with nvml_errors(nvml, "shutting NVML down"):
                    nvml.nvmlShutdown()

    def _ensure_open(self) -> None:
        nvml = self._nvml
        if not self._open:
            with nvml_errors(nvml, "initialising NVML"):
                nvml.nvmlInit()
            self._open = True

    def _handle(self, uuid: str) -> DeviceHandle:
        nvml = self._nvml
        handle = self._handles.get(uuid)
        if handle is None:
            with nvml_errors(nvml, f"GPU {uuid}: getting its handle"):
                handle = self._handles[uuid] = nvml.nvmlDeviceGetHandleByUUID(uuid)
        return handle

    def _read_gpu(self, gpu: Gpu, *, mps: bool) -> tuple[list[GpuProcess], DeviceMemory, bool]:
        nvml = self._nvml
        handle = self._handle(gpu.uuid)
        with nvml_errors(nvml, f"GPU {gpu.index} ({gpu.uuid}): reading its memory"):
            info = nvml.nvmlDeviceGetMemoryInfo(handle)
        used = DeviceMemory(gpu=gpu.uuid, total=int(info.total), used=int(info.used))
        with nvml_errors(nvml, f"GPU {gpu.index} ({gpu.uuid}): listing its processes"):
            listed: list[ProcessInfo] = list(nvml.nvmlDeviceGetComputeRunningProcesses(handle))
            if mps:
                listed += nvml.nvmlDeviceGetMPSComputeRunningProcesses(handle)
        utilization = self._utilization(gpu, handle) if listed else _Utilization(by_pid=None)
        mig: dict[tuple[int, int], str] = {(m.gi_id, m.ci_id): m.uuid for m in gpu.mig_devices}
        seen: set[tuple[int, str]] = set()
        found = []
        for process in listed:
            device: str | None = gpu.uuid
            if gpu.mig_enabled:
                device = mig.get((int(process.gpuInstanceId), int(process.computeInstanceId)))
            if device is None:
                continue  # an instance made after the inventory was read: the next one has it
            pid = int(process.pid)
            if (pid, device) in seen:
                continue  # an MPS client listed by both calls
            seen.add((pid, device))
            sm = utilization.by_pid.get(pid, 0) if utilization.by_pid is not None else None
            memory = process.usedGpuMemory
            found.append(
                GpuProcess(
                    pid=pid,
                    device=device,
                    gpu=gpu.uuid,
                    memory=int(memory) if memory is not None else None,
                    sm=min(sm, 100) / 100 if sm is not None else None,
                )
            )
        return found, used, utilization.by_pid is not None

    def _utilization(self, gpu: Gpu, handle: DeviceHandle) -> _Utilization:
        nvml = self._nvml
        key = (gpu.uuid, gpu.mig_enabled)
        if key in self._calls:
            call = self._calls[key]
            if call is None:
                return _Utilization(by_pid=None)
            candidates: Sequence[str] = (call,)
        else:
            candidates = [c for c in (INFO_CALL, SAMPLE_CALL) if c not in self._lacking]
        since = int((self._clock() - _WINDOW_S) * 1_000_000)
        refusals = []
        for call in candidates:
            try:
                samples = self._samples(call, handle, since)
            except nvml.NVMLError as exc:
                if is_code(exc, nvml.NVML_ERROR_NOT_FOUND):
                    self._calls[key] = call
                    return _Utilization(by_pid={})  # nothing used the SMs in the window
                if is_code(exc, nvml.NVML_ERROR_FUNCTION_NOT_FOUND):
                    self._lacking.add(call)
                elif not is_code(exc, nvml.NVML_ERROR_NOT_SUPPORTED):
                    log.debug("%s", to_nvml_error(nvml, exc, f"GPU {gpu.uuid}: {call}"))
                    return _Utilization(by_pid=None)  # a passing failure: try again next time
                refusals.append(f"{call}: {to_nvml_error(nvml, exc, call).name}")
                continue
            self._calls[key] = call
            latest: dict[int, tuple[int, int]] = {}
            for sample in samples:
                stamp = int(sample.timeStamp)
                if stamp >= latest.get(int(sample.pid), (-1, 0))[0]:
                    latest[int(sample.pid)] = (stamp, int(sample.smUtil))
            return _Utilization(by_pid={pid: sm for pid, (_, sm) in latest.items()})
        self._calls[key] = None
        log.info(
            "GPU %d (%s)%s: NVML gives no per-process utilization (%s): its pods' memory is "
            "reported, their utilization is not",
            gpu.index,
            gpu.uuid,
            " in MIG mode" if gpu.mig_enabled else "",
            "; ".join(refusals) or "both calls missing from the driver",
        )
        return _Utilization(by_pid=None)

    def _samples(
        self, call: str, handle: DeviceHandle, since: int
    ) -> Sequence[ProcessUtilizationSample]:
        nvml = self._nvml
        if call == INFO_CALL:
            return nvml.nvmlDeviceGetProcessesUtilizationInfo(handle, since)
        return nvml.nvmlDeviceGetProcessUtilization(handle, since)
