"""NVML's process queries: the simulated pynvml's answers, and the adapter reading them.

The simulator is held to what a caller of pynvml sees (shapes, instance ids, error codes); the
adapter (`nvml/processes.py` `ProcessReader`) is run over it the way the daemon runs it.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pynvml
import pytest
import yaml_fast
from support.observe import set_lost, wait_until_shut_down

from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.nvml.discover import discover
from sharing_plugin.nvml.processes import ProcessReader
from sharing_plugin.sim.nvml.simulated import SimulatedNvml
from sharing_plugin.usage.model import GpuProcess

NO_ID = 0xFFFFFFFF
GIB = 1 << 30


def node(tmp_path: Path, **description: Any) -> Path:
    path = tmp_path / "node.yaml"
    path.write_text(yaml_fast.dump({"gpus": [{"product": "Tesla T4", "count": 2}], **description}))
    return path


def rewrite(path: Path, **changes: Any) -> None:
    """The node file with `changes`, replaced in one rename (as an editor saves it)."""
    data = {"gpus": [{"product": "Tesla T4", "count": 2}], **changes}
    tmp = path.with_name("node.tmp")
    tmp.write_text(yaml_fast.dump(data))
    tmp.replace(path)


def read(nvml: SimulatedNvml, inventory: Inventory, **kw: Any) -> dict[int, GpuProcess]:
    reader = ProcessReader(nvml)
    try:
        usage = reader.read(inventory, **kw)
    finally:
        reader.close()
    assert usage.problems == ()
    return {p.pid: p for p in usage.processes}


def test_processes_reach_the_adapter_with_memory_and_sm(tmp_path: Path) -> None:
    path = node(
        tmp_path,
        processes=[
            {"gpu": 0, "pid": 100, "memory": "1Gi", "sm": 30},
            {"gpu": 0, "pid": 101, "memory": 512 << 20},
            {"gpu": 1, "pid": 102, "memory": "2Gi", "sm": 100},
        ],
    )
    nvml = SimulatedNvml.from_file(path)
    inventory = discover(nvml)
    gpu0, gpu1 = (g.uuid for g in inventory.gpus)
    found = read(nvml, inventory)
    assert found == {
        100: GpuProcess(pid=100, device=gpu0, gpu=gpu0, memory=GIB, sm=0.3),
        101: GpuProcess(pid=101, device=gpu0, gpu=gpu0, memory=512 << 20, sm=0.0),
        102: GpuProcess(pid=102, device=gpu1, gpu=gpu1, memory=2 * GIB, sm=1.0),
    }
    usage = ProcessReader(nvml).read(inventory)
    assert {m.gpu: m.used for m in usage.memory} == {gpu0: GIB + (512 << 20), gpu1: 2 * GIB}
    assert usage.sampled == {gpu0, gpu1}


def test_the_simulator_answers_in_pynvml_shapes(tmp_path: Path) -> None:
    nvml = SimulatedNvml.from_file(
        node(tmp_path, processes=[{"gpu": 0, "pid": 7, "memory": "1Gi", "sm": 40}])
    )
    nvml.nvmlInit()
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        (info,) = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        assert isinstance(info, pynvml.nvmlFriendlyObject)
        assert (info.pid, info.usedGpuMemory) == (7, GIB)
        assert (info.gpuInstanceId, info.computeInstanceId) == (NO_ID, NO_ID)
        assert nvml.nvmlDeviceGetMPSComputeRunningProcesses(handle) == []
        assert nvml.nvmlDeviceGetComputeRunningProcesses(nvml.nvmlDeviceGetHandleByIndex(1)) == []

        before = time.time_ns() // 1000 - 1
        (sample,) = nvml.nvmlDeviceGetProcessUtilization(handle, before)
        assert isinstance(sample, pynvml.c_nvmlProcessUtilizationSample_t)
        assert (sample.pid, sample.smUtil) == (7, 40) and sample.timeStamp > before
        (info_sample,) = nvml.nvmlDeviceGetProcessesUtilizationInfo(handle, before)
        assert isinstance(info_sample, pynvml.c_nvmlProcessUtilizationInfo_v1_t)
        # no sample newer than the one the caller saw last: NOT_FOUND, as NVML answers
        with pytest.raises(pynvml.NVMLError) as raised:
            nvml.nvmlDeviceGetProcessUtilization(handle, sample.timeStamp + 10**9)
        assert raised.value.value == pynvml.NVML_ERROR_NOT_FOUND
        with pytest.raises(pynvml.NVMLError) as raised:  # an idle GPU has no samples either
            nvml.nvmlDeviceGetProcessUtilization(nvml.nvmlDeviceGetHandleByIndex(1), 0)
        assert raised.value.value == pynvml.NVML_ERROR_NOT_FOUND
    finally:
        nvml.nvmlShutdown()


def test_mig_processes_carry_their_instance_ids_and_have_no_utilization(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "node.yaml"
    path.write_text(
        yaml_fast.dump(
            {
                "gpus": [
                    {
                        "product": "NVIDIA A100-SXM4-80GB",
                        "mig": {"instances": ["3g.40gb", "1g.10gb@5", "1g.10gb@6"]},
                    }
                ],
                "processes": [
                    {"gpu": 0, "mig": "1g.10gb@6", "pid": 10, "memory": "3Gi", "sm": 50},
                    {"gpu": 0, "mig": "3g.40gb", "pid": 11, "memory": "20Gi"},
                    {"gpu": 0, "pid": 12, "memory": "1Gi"},  # no MIG device: cannot run
                    {"gpu": 0, "mig": "2g.20gb", "pid": 13, "memory": "1Gi"},  # no such one
                ],
            }
        )
    )
    nvml = SimulatedNvml.from_file(path)
    inventory = discover(nvml)
    (gpu,) = inventory.gpus
    by_place = {(m.profile, m.placement.start): m for m in gpu.mig_devices}
    small, big = by_place[("1g.10gb", 6)], by_place[("3g.40gb", 0)]

    nvml.nvmlInit()
    try:
        parent = nvml.nvmlDeviceGetHandleByIndex(0)
        ids = {
            p.pid: (p.gpuInstanceId, p.computeInstanceId)
            for p in nvml.nvmlDeviceGetComputeRunningProcesses(parent)
        }
        assert ids == {10: (small.gi_id, small.ci_id), 11: (big.gi_id, big.ci_id)}
        mig_handle = nvml.nvmlDeviceGetHandleByUUID(small.uuid)
        assert [p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(mig_handle)] == [10]
        assert nvml.nvmlDeviceGetMemoryInfo(mig_handle).used == 3 * GIB
        for call in (
            nvml.nvmlDeviceGetProcessUtilization,
            nvml.nvmlDeviceGetProcessesUtilizationInfo,
        ):
            with pytest.raises(pynvml.NVMLError) as raised:
                call(parent, 0)
            assert raised.value.value == pynvml.NVML_ERROR_NOT_SUPPORTED
    finally:
        nvml.nvmlShutdown()

    caplog.set_level(logging.INFO, logger="sharing_plugin.nvml.processes")
    reader = ProcessReader(nvml)
    for _ in range(3):
        usage = reader.read(inventory)
    reader.close()
    assert {(p.pid, p.device, p.memory, p.sm) for p in usage.processes} == {
        (10, small.uuid, 3 * GIB, None),
        (11, big.uuid, 20 * GIB, None),
    }
    said = [
        r.getMessage() for r in caplog.records if "no per-process utilization" in r.getMessage()
    ]
    assert len(said) == 1 and "MIG mode" in said[0]


def test_a_driver_without_the_newer_call_answers_through_the_older_one(tmp_path: Path) -> None:
    nvml = SimulatedNvml.from_file(
        node(
            tmp_path,
            processes=[{"gpu": 1, "pid": 5, "memory": "1Gi", "sm": 20}],
            driverLacks=["nvmlDeviceGetProcessesUtilizationInfo"],
        )
    )
    nvml.nvmlInit()
    try:
        with pytest.raises(pynvml.NVMLError) as raised:
            nvml.nvmlDeviceGetProcessesUtilizationInfo(nvml.nvmlDeviceGetHandleByIndex(1), 0)
        assert raised.value.value == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    finally:
        nvml.nvmlShutdown()
    assert read(nvml, discover(nvml))[5].sm == 0.2


def test_a_driver_with_neither_call_gives_memory_only_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    nvml = SimulatedNvml.from_file(
        node(
            tmp_path,
            processes=[{"gpu": 0, "pid": 5, "memory": "1Gi", "sm": 20}],
            driverLacks=[
                "nvmlDeviceGetProcessesUtilizationInfo",
                "nvmlDeviceGetProcessUtilization",
            ],
        )
    )
    inventory = discover(nvml)
    caplog.set_level(logging.INFO, logger="sharing_plugin.nvml.processes")
    reader = ProcessReader(nvml)
    for _ in range(3):
        usage = reader.read(inventory)
    reader.close()
    (process,) = usage.processes
    assert (process.memory, process.sm) == (GIB, None)
    assert usage.sampled == frozenset()
    said = [
        r.getMessage() for r in caplog.records if "no per-process utilization" in r.getMessage()
    ]
    assert len(said) == 1 and "FUNCTION_NOT_FOUND" in said[0]


def test_processes_edited_while_running_are_seen_at_the_next_read(tmp_path: Path) -> None:
    path = node(tmp_path, processes=[{"gpu": 0, "pid": 1, "memory": "1Gi"}])
    nvml = SimulatedNvml.from_file(path)
    inventory = discover(nvml)
    reader = ProcessReader(nvml)
    try:
        assert [p.pid for p in reader.read(inventory).processes] == [1]
        rewrite(path, processes=[{"gpu": 0, "pid": 1, "memory": "1Gi"}, {"gpu": 1, "pid": 2}])
        assert sorted(p.pid for p in reader.read(inventory).processes) == [1, 2]
        path.write_text("gpus: [{product: Tesla T4, count: 2}]\nprocesses: [{gpu: 0, pid:")
        assert sorted(p.pid for p in reader.read(inventory).processes) == [1, 2]  # half-written
        rewrite(path, processes=[])
        assert reader.read(inventory).processes == ()
    finally:
        reader.close()


def test_mps_clients_are_read_only_for_gpus_that_back_an_mps_resource(tmp_path: Path) -> None:
    nvml = SimulatedNvml.from_file(
        node(
            tmp_path,
            processes=[
                {"gpu": 0, "pid": 50, "memory": "100Mi"},  # the MPS server
                {"gpu": 0, "pid": 51, "memory": "1Gi", "mps": True},
            ],
        )
    )
    inventory = discover(nvml)
    assert sorted(read(nvml, inventory)) == [50]
    assert sorted(read(nvml, inventory, mps={inventory.gpus[0].uuid})) == [50, 51]


def test_a_lost_gpu_is_a_problem_and_the_others_are_still_read(tmp_path: Path) -> None:
    nvml = SimulatedNvml.from_file(
        node(tmp_path, processes=[{"gpu": 0, "pid": 1}, {"gpu": 1, "pid": 2}])
    )
    inventory = discover(nvml)
    set_lost(nvml, 0)
    reader = ProcessReader(nvml)
    usage = reader.read(inventory)
    reader.close()
    assert [p.pid for p in usage.processes] == [2]
    (problem,) = usage.problems
    assert "NVML_ERROR_GPU_IS_LOST" in problem
    assert wait_until_shut_down(nvml, 1.0)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"gpu": 0, "pid": 0}, "greater than or equal to 1"),
        ({"gpu": 0, "pid": 1, "memory": "1 gig"}, "quantity such as 1Gi"),
        ({"gpu": 0, "pid": 1, "sm": 101}, "less than or equal to 100"),
        ({"gpu": 0, "pid": 1, "mig": "1g.10gb@x"}, "should match pattern"),
        ({"gpu": 0, "pid": 1, "cpu": 3}, "Extra inputs"),
    ],
)
def test_bad_process_entries_are_refused_naming_the_key(
    tmp_path: Path, entry: dict[str, Any], message: str
) -> None:
    from sharing_plugin.errors import ConfigError

    with pytest.raises(ConfigError) as raised:
        SimulatedNvml.from_file(node(tmp_path, processes=[entry]))
    assert message in str(raised.value)
    assert "processes[0]" in str(raised.value)
