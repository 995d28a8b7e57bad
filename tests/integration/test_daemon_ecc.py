"""ECC errors end to end: simulated ECC events -> the daemon -> kubelet's allocatable.

A double-bit (uncorrectable) ECC error marks its GPU Unhealthy with every device it backs,
whatever the Xid settings say; a single-bit (corrected) one changes nothing; `health.eventTypes`
without the double-bit type leaves it unwatched. Faults are injected once the daemon's event
watch is registered (an event before it is lost, as with NVML). That something changed nothing
is shown by a later fault being handled after it (events are handled in order), never by
sleeping.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from daemon_harness import Running, append_fault, node_file, running
from support.observe import health_monitor, inject_ecc, inject_xid

GPU = "nvidia.com/gpu"
NODE: dict[str, Any] = {
    "name": "ecc-node",
    "gpus": [{"product": "NVIDIA A100-SXM4-80GB", "count": 4, "numaNode": 0}],
    "nvlink": "all",
    "faults": [],
}
SHARED = """\
version: v1
sharing:
  timeSlicing:
    resources:
      - name: gpu
        replicas: 2
"""


def unhealthy(run: Running) -> set[str]:
    return {i for i, h in run.kubelet.devices(GPU).items() if h != "Healthy"}


def backed_by(run: Running, index: int) -> set[str]:
    plan = run.daemon.supervisor.advertised
    assert plan is not None
    uuid = run.nvml.gpus[index].uuid
    return {d.id for r in plan.resources for d in r.devices if uuid in (d.physical, d.gpu_uuid)}


async def watching(run: Running) -> None:
    monitor = health_monitor(run.daemon.pipeline)
    assert monitor is not None
    await asyncio.wait_for(monitor.watching.wait(), 2)


async def test_a_double_bit_ecc_error_drops_exactly_that_gpus_devices(short_dir: Path) -> None:
    node = node_file(short_dir, NODE)
    # Xid 48, the driver's Xid for the same error, ignored: the ECC event still counts.
    config = SHARED + "health:\n  ignoredXids: [13, 31, 43, 45, 48, 68, 109]\n"
    async with running(short_dir, config, gpus=f"simulated:{node}") as run:
        await watching(run)
        expected = backed_by(run, 2)
        assert len(expected) == 2
        inject_ecc(run.nvml, 2, "double")
        await run.kubelet.wait_for(lambda: unhealthy(run) == expected, timeout=1.0)
        assert run.allocatable() == {GPU: 6}
        assert not run.daemon.pipeline.health[run.nvml.gpus[2].uuid]
        # The node file's `{gpu, ecc: double}` entry takes the same path.
        expected |= backed_by(run, 0)
        append_fault(node, {"gpu": 0, "ecc": "double"})
        await run.kubelet.wait_for(lambda: unhealthy(run) == expected, timeout=1.0)
        assert run.allocatable() == {GPU: 4}


async def test_a_single_bit_ecc_error_changes_nothing(short_dir: Path) -> None:
    node = node_file(short_dir, NODE)
    async with running(short_dir, SHARED, gpus=f"simulated:{node}") as run:
        await watching(run)
        inject_ecc(run.nvml, 1, "single")
        inject_xid(run.nvml, 3, 79)  # handled after the single-bit error
        expected = backed_by(run, 3)
        await run.kubelet.wait_for(lambda: unhealthy(run) == expected, timeout=1.0)
        assert run.daemon.pipeline.health[run.nvml.gpus[1].uuid]
        assert run.allocatable() == {GPU: 6}
        # Counted, though it changes nothing.
        gpu1 = run.nvml.gpus[1].uuid
        assert (
            f'sharing_plugin_gpu_ecc_events_total{{gpu="{gpu1}",kind="single-bit-ecc"}} 1.0'
            in run.daemon.metrics.render().decode()
        )


async def test_event_types_without_double_bit_ecc_leave_it_unwatched(short_dir: Path) -> None:
    node = node_file(short_dir, NODE)
    config = SHARED + "health:\n  eventTypes: [EventTypeXidCriticalError]\n"
    async with running(short_dir, config, gpus=f"simulated:{node}") as run:
        await watching(run)
        inject_ecc(run.nvml, 2, "double")  # not registered: NVML does not queue it
        inject_xid(run.nvml, 3, 79)
        expected = backed_by(run, 3)
        await run.kubelet.wait_for(lambda: unhealthy(run) == expected, timeout=1.0)
        assert run.allocatable() == {GPU: 6}
        assert run.daemon.pipeline.health[run.nvml.gpus[2].uuid]


async def test_event_types_without_xids_leave_xids_unwatched(short_dir: Path) -> None:
    node = node_file(short_dir, NODE)
    config = SHARED + "health:\n  eventTypes: [EventTypeDoubleBitEccError]\n"
    async with running(short_dir, config, gpus=f"simulated:{node}") as run:
        await watching(run)
        inject_xid(run.nvml, 2, 79)  # not registered
        inject_ecc(run.nvml, 3, "double")
        expected = backed_by(run, 3)
        await run.kubelet.wait_for(lambda: unhealthy(run) == expected, timeout=1.0)
        assert run.daemon.pipeline.health[run.nvml.gpus[2].uuid]
