"""`run` with MPS: devices Healthy only while the resource's control daemon serves.

The plugin runs in-process against the kubelet simulator, `mps-control` in-process beside it,
and every control daemon is a real process of the simulated binary.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest
from daemon_harness import eventually, running
from mps_harness import (
    RESOURCE,
    controller,
    daemon_pid,
    eventually_record,
    limits_of,
    mps_config,
    pipe_of,
    resource_root,
    write,
)
from support.observe import next_applied

from sharing_plugin.mps import (
    DaemonRecord,
    DaemonState,
    process_alive,
    read_record,
    write_record,
)

REPLICAS = 4
ALL = 2 * REPLICAS  # two GPUs


@pytest.mark.subprocess
async def test_run_first_then_mps_control_and_a_crash_is_unhealthy_within_a_second(
    short_dir: Path, binary: Path, gpus: str
) -> None:
    mps_root = short_dir / "mps"
    async with running(short_dir, mps_config(mps_root, replicas=REPLICAS), gpus=gpus) as run:
        # No daemon yet: advertised, but nothing can be admitted onto it.
        assert run.capacity() == {RESOURCE: ALL}
        assert run.allocatable() == {RESOURCE: 0}
        assert run.daemon.status.to_json()["mps"][RESOURCE]["state"] == "absent"

        async with controller(run.config, binary, gpus=gpus, kubelet_dir=short_dir):
            await run.kubelet.wait_for(lambda: run.allocatable() == {RESOURCE: ALL}, timeout=10)
            status = run.daemon.status.to_json()["mps"][RESOURCE]
            pid = daemon_pid(mps_root)
            assert status["state"] == "ready"
            assert status["pid"] == pid
            assert status["limits"]["activeThreadPercentage"] == 25
            assert sorted(status["limits"]["pinnedMemoryLimits"].values()) == [
                "10240M",
                "20480M",
            ]

            assert pid is not None
            loop = asyncio.get_running_loop()
            started = loop.time()
            os.kill(pid, signal.SIGKILL)
            await run.kubelet.wait_for(lambda: run.allocatable() == {RESOURCE: 0}, timeout=1.0)
            assert loop.time() - started < 1.0
            assert run.capacity() == {RESOURCE: ALL}

            await run.kubelet.wait_for(lambda: run.allocatable() == {RESOURCE: ALL}, timeout=10)
            status = run.daemon.status.to_json()["mps"][RESOURCE]
            assert status["restarts"] == 1
            assert status["pid"] == daemon_pid(mps_root) != pid
            assert (
                f'sharing_plugin_mps_daemon_restarts_total{{resource="{RESOURCE}"}} 1.0'
                in run.daemon.metrics.render().decode()
            )


@pytest.mark.subprocess
async def test_mps_control_first_and_a_plugin_restart_finds_the_daemon_serving(
    short_dir: Path, binary: Path, gpus: str
) -> None:
    mps_root = short_dir / "mps"
    config = short_dir / "config.yaml"
    config.write_text(mps_config(mps_root, replicas=REPLICAS))
    async with controller(config, binary, gpus=gpus, kubelet_dir=short_dir):
        ready = await eventually_record(mps_root, lambda r: r.state is DaemonState.READY)
        for _ in range(2):  # a start, then a restart of the plugin
            async with running(short_dir, None, config_path=config, gpus=gpus) as run:
                assert run.allocatable() == {RESOURCE: ALL}
                # Never advertised Unhealthy on the way: the daemon served all along.
                assert all(health == "Healthy" for health in run.kubelet.devices(RESOURCE).values())
                assert run.daemon.status.to_json()["mps"][RESOURCE]["pid"] == ready.pid
        assert daemon_pid(mps_root) == ready.pid


@pytest.mark.subprocess
async def test_a_limit_change_waits_for_the_pods_holding_replicas(
    short_dir: Path, binary: Path, gpus: str
) -> None:
    mps_root = short_dir / "mps"
    async with (
        running(short_dir, mps_config(mps_root, replicas=REPLICAS), gpus=gpus) as run,
        controller(run.config, binary, gpus=gpus, kubelet_dir=short_dir) as control,
    ):
        await run.kubelet.wait_for(lambda: run.allocatable() == {RESOURCE: ALL}, timeout=10)
        first = daemon_pid(mps_root)
        await run.kubelet.admit_pod("client", containers={"main": {RESOURCE: 1}})

        with control.pipeline.outcomes() as outcomes:
            write(run.config, mps_config(mps_root, replicas=2))
            await next_applied(outcomes)
        waiting = await eventually_record(mps_root, lambda r: r.state is DaemonState.WAITING)
        assert waiting.pid == first
        assert waiting.reason is not None and "1 replica(s)" in waiting.reason
        assert first is not None and process_alive(first)
        await eventually(lambda: run.daemon.status.to_json()["mps"][RESOURCE]["state"] == "waiting")
        # The old daemon still serves the pod, so nothing is refused meanwhile.
        assert run.kubelet.allocatable(RESOURCE) > 0

        run.kubelet.delete_pod("client")
        replaced = await eventually_record(
            mps_root, lambda r: r.state is DaemonState.READY and r.pid != first
        )
        assert not process_alive(first)
        assert replaced.limits["activeThreadPercentage"] == 50
        assert limits_of(binary, pipe_of(mps_root), 2) == ("50.0", ["20480M", "40960M"])
        await run.kubelet.wait_for(lambda: run.allocatable() == {RESOURCE: 4}, timeout=10)


@pytest.mark.subprocess
async def test_a_waiting_change_keeps_waiting_while_the_kubelet_cannot_tell(
    short_dir: Path, binary: Path, gpus: str
) -> None:
    mps_root = short_dir / "mps"
    async with (
        running(short_dir, mps_config(mps_root, replicas=REPLICAS), gpus=gpus) as run,
        controller(run.config, binary, gpus=gpus, kubelet_dir=short_dir) as control,
    ):
        await run.kubelet.wait_for(lambda: run.allocatable() == {RESOURCE: ALL}, timeout=10)
        first = daemon_pid(mps_root)
        await run.kubelet.admit_pod("client", containers={"main": {RESOURCE: 1}})
        with control.pipeline.outcomes() as outcomes:
            write(run.config, mps_config(mps_root, replicas=2))
            await next_applied(outcomes)
        await eventually_record(mps_root, lambda r: r.state is DaemonState.WAITING)
        # PodResources gone (a kubelet restarting): the pod is still there, its daemon stays.
        run.kubelet.pod_resources_socket.unlink()
        # The next change (no MPS at all) is weighed against a kubelet that cannot tell: its
        # last answer counts, so the stop waits for the pod too, and says so once applied.
        with control.pipeline.outcomes() as outcomes:
            write(run.config, f"version: v1\nflags:\n  mpsRoot: {mps_root}\n")
            await next_applied(outcomes)
        record = read_record(resource_root(mps_root))
        assert record is not None and record.state is DaemonState.WAITING
        assert record.reason is not None and record.reason.startswith("stopping the daemon")
        assert first is not None and process_alive(first)
        assert daemon_pid(mps_root) == first


async def test_a_state_file_nobody_confirms_goes_stale(short_dir: Path, gpus: str) -> None:
    mps_root = short_dir / "mps"

    def confirm() -> None:
        write_record(
            resource_root(mps_root),
            DaemonRecord(
                resource=RESOURCE,
                state=DaemonState.READY,
                fingerprint="f",
                pid=os.getpid(),
                heartbeat_s=0.1,
                updated_at=time.time(),
            ),
        )

    confirm()
    async with running(short_dir, mps_config(mps_root, replicas=REPLICAS), gpus=gpus) as run:
        # Three heartbeats (0.3 s) without a confirmation: no longer vouched for.
        await run.kubelet.wait_for(lambda: run.allocatable() == {RESOURCE: 0}, timeout=5)
        assert run.daemon.status.to_json()["mps"][RESOURCE]["state"] == "stale"
        confirm()
        await run.kubelet.wait_for(lambda: run.allocatable() == {RESOURCE: ALL}, timeout=5)
