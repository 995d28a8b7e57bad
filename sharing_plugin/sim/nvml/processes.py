"""NVML's process queries on a simulated node: who runs on each GPU, how much memory, how busy.

Answers have the shapes pynvml returns: the running-process calls give pynvml's friendly
objects built from its own ``c_nvmlProcessInfo_v3_t``, the utilization calls slices of its
``c_nvmlProcessUtilizationSample_t`` and ``c_nvmlProcessUtilizationInfo_v1_t`` arrays. The
driver's rules are followed where a caller can tell:

- in MIG mode the GPU's handle lists every process of its MIG devices with their GPU and
  compute instance ids, and a MIG device's handle lists its own; outside MIG mode both ids are
  0xFFFFFFFF;
- a utilization sample exists only for a process that used the SMs (`sm` above 0), stamped
  when it is asked for; none newer than `lastSeenTimeStamp` is NVML_ERROR_NOT_FOUND;
- per-process utilization is not supported on MIG-enabled GPUs (NVML_ERROR_NOT_SUPPORTED), and
  a call the node's `driverLacks` names does not exist (NVML_ERROR_FUNCTION_NOT_FOUND, raised
  by pynvml when libnvidia-ml.so lacks the symbol).

pynvml's two-call buffer sizing (NVML_ERROR_INSUFFICIENT_SIZE, then the real call) is hidden
inside its wrappers, so it is not modelled: what the caller sees is the wrapper's answer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pynvml

from sharing_plugin.sim.nvml.node import LoadedNode, parse_instance
from sharing_plugin.sim.nvml.state import NO_ID, SimComputeInstance, SimGpu, nvml_error
from sharing_plugin.sim.nvml.workload import Process, file_stamp, read_processes

Placed = tuple[Process, SimGpu, SimComputeInstance | None]


class SimProcesses:
    """The node's process table, kept in step with its file."""

    def __init__(self, gpus: list[SimGpu], node: LoadedNode) -> None:
        self._gpus = gpus
        self._path: Path | None = node.path
        self._processes = node.description.processes
        self.lacks = frozenset(node.description.driver_lacks)
        self._lock = threading.Lock()
        self._stamp = file_stamp(self._path)
        self.queries = 0  # running-process calls answered: what tests count NVML passes by
        self._placed_for: tuple[tuple[Process, ...], object] | None = None
        self._placed_by: dict[int, list[Placed]] = {}

    # ---- what the NVML calls answer ----

    def running(self, device: SimGpu | SimComputeInstance, *, mps: bool) -> list[Any]:
        """nvmlDeviceGet[MPS]ComputeRunningProcesses for a GPU or MIG device handle."""
        with self._lock:
            self.queries += 1
        infos = []
        for process, _, ci in self._on(device):
            if process.mps != mps:
                continue
            gi_id, ci_id = (ci.gpu_instance.id, ci.id) if ci is not None else (NO_ID, NO_ID)
            info = pynvml.c_nvmlProcessInfo_v3_t(
                pid=process.pid,
                usedGpuMemory=process.memory,
                gpuInstanceId=gi_id,
                computeInstanceId=ci_id,
            )
            infos.append(pynvml.nvmlStructToFriendlyObject(info))
        return infos

    def utilization(
        self, device: SimGpu | SimComputeInstance, last_seen: int, *, call: str
    ) -> Sequence[Any]:
        """nvmlDeviceGetProcessUtilization / nvmlDeviceGetProcessesUtilizationInfo (`call`)."""
        if call in self.lacks:
            raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        gpu = device.gpu_instance.gpu if isinstance(device, SimComputeInstance) else device
        if gpu.mig_current:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        now = time.time_ns() // 1000
        busy = [p for p, _, _ in self._on(device) if p.sm]
        if now <= last_seen or not busy:
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        if call == "nvmlDeviceGetProcessUtilization":
            array: Any = (pynvml.c_nvmlProcessUtilizationSample_t * len(busy))()
        else:
            array = (pynvml.c_nvmlProcessUtilizationInfo_v1_t * len(busy))()
        for slot, process in zip(array, busy, strict=True):
            slot.pid, slot.timeStamp, slot.smUtil = process.pid, now, process.sm
        samples: list[Any] = array[0 : len(busy)]  # what pynvml returns: a slice of the array
        return samples

    def memory_used(self, device: SimGpu | SimComputeInstance) -> int:
        """What the processes on `device` use (the GPU's handle in MIG mode: all of them)."""
        return sum(process.memory for process, _, _ in self._on(device))

    # ---- where each process runs ----

    def _on(self, device: SimGpu | SimComputeInstance) -> list[Placed]:
        return self._placed().get(id(device), [])

    def _placed(self) -> dict[int, list[Placed]]:
        """Processes by the id() of the GPU and of the MIG device they run on; worked out again
        only when the list or a GPU's MIG layout changed (a node may list hundreds). A MIG
        device that runs a process is held by the table, so its id() is not reused."""
        processes = self._current()
        layout = tuple((g.mig_current, tuple(id(ci) for ci in g.mig_devices())) for g in self._gpus)
        with self._lock:
            known = self._placed_for
            # The list itself is kept (not its id): a freed tuple's id may come back.
            if known is not None and known[0] is processes and known[1] == layout:
                return self._placed_by
        by: dict[int, list[Placed]] = {}
        for process in processes:
            where = self._resolve(process)
            if where is None:
                continue
            gpu, ci = where
            by.setdefault(id(gpu), []).append((process, gpu, ci))
            if ci is not None:
                by.setdefault(id(ci), []).append((process, gpu, ci))
        with self._lock:
            self._placed_for, self._placed_by = (processes, layout), by
        return by

    def _resolve(self, process: Process) -> tuple[SimGpu, SimComputeInstance | None] | None:
        for gpu in self._gpus:
            if process.gpu in (gpu.index, gpu.uuid):
                if process.mig is None:
                    return (gpu, None) if not gpu.mig_current else None
                ci = _instance(gpu, process.mig)
                return (gpu, ci) if ci is not None else None
            for ci in gpu.mig_devices():
                if process.gpu == ci.uuid:
                    return (gpu, ci) if gpu.mig_current else None
        return None

    def _current(self) -> tuple[Process, ...]:
        if self._path is None:
            return self._processes
        stamp = file_stamp(self._path)
        with self._lock:
            if stamp != self._stamp:
                processes = read_processes(self._path)
                if processes is not None:  # half-written: look again at the next call
                    self._processes, self._stamp = processes, stamp
            return self._processes


def _instance(gpu: SimGpu, text: str) -> SimComputeInstance | None:
    """The compute instance of the GPU instance `text` (``profile@start``) names on `gpu`."""
    if not gpu.mig_current:
        return None
    name, start = parse_instance(text)
    for gi in sorted(gpu.gpu_instances, key=lambda g: g.id):
        if gi.spec.name == name and start in (None, gi.start) and gi.compute_instances:
            return gi.compute_instances[0]
    return None
