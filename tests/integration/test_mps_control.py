"""`mps-control` in-process, driving the simulated control binary as real processes."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from daemon_harness import eventually
from mps_harness import (
    RESOURCE,
    controller,
    daemon_pid,
    eventually_record,
    limits_of,
    mps_config,
    pipe_of,
    record,
    resource_root,
    write,
)
from support.observe import next_applied

from sharing_plugin.dra.checkpoint import (
    Checkpoint,
    PreparedClaim,
    PreparedDevice,
    checkpoint_path,
    held_by_resource,
)
from sharing_plugin.dra.claims import ClaimRef
from sharing_plugin.mps import DaemonState, process_alive
from sharing_plugin.views.dra_api import DEFAULT_DRIVER, PublishedDevice


@pytest.mark.subprocess
async def test_starts_one_daemon_with_the_reference_limits(
    short_dir: Path, binary: Path, gpus: str
) -> None:
    mps_root = short_dir / "mps"
    config = short_dir / "config.yaml"
    config.write_text(mps_config(mps_root, replicas=4))
    async with controller(config, binary, gpus=gpus):
        found = await eventually_record(mps_root, lambda r: r.state is DaemonState.READY)
        pid = daemon_pid(mps_root)
        assert found.pid == pid and pid is not None and process_alive(pid)
        # 40 GB and 80 GB A100s (40960 and 81920 MiB) with 4 replicas each: memory / 4 per
        # client, 100 / 4 percent of the threads.
        assert limits_of(binary, pipe_of(mps_root), 2) == ("25.0", ["10240M", "20480M"])
        assert found.limits["activeThreadPercentage"] == 25
        assert list(found.limits["pinnedMemoryLimits"].values()) == ["10240M", "20480M"]
        assert (resource_root(mps_root) / "log" / "control.log").exists()


@pytest.mark.subprocess
async def test_for_dra_claims_the_daemon_limits_no_client_itself(
    short_dir: Path, binary: Path, gpus: str
) -> None:
    mps_root = short_dir / "mps"
    config = short_dir / "config.yaml"
    config.write_text(mps_config(mps_root, replicas=4))
    async with controller(config, binary, gpus=gpus, limits_from_claims=True):
        found = await eventually_record(mps_root, lambda r: r.state is DaemonState.READY)
        # Each DRA client brings the limits of what its claim was granted (its CDI edits):
        # the daemon leaves every thread and each device's whole memory to them.
        assert limits_of(binary, pipe_of(mps_root), 2) == ("100.0", ["40960M", "81920M"])
        assert found.limits["activeThreadPercentage"] == 100


@pytest.mark.subprocess
async def test_a_dead_daemon_is_restarted(short_dir: Path, binary: Path, gpus: str) -> None:
    mps_root = short_dir / "mps"
    config = short_dir / "config.yaml"
    config.write_text(mps_config(mps_root, replicas=2))
    async with controller(config, binary, gpus=gpus):
        first = await eventually_record(mps_root, lambda r: r.state is DaemonState.READY)
        assert first.pid is not None
        os.kill(first.pid, signal.SIGKILL)
        again = await eventually_record(
            mps_root, lambda r: r.state is DaemonState.READY and r.pid != first.pid
        )
        assert again.restarts == 1
        assert again.pid is not None and process_alive(again.pid)
        assert limits_of(binary, pipe_of(mps_root), 2) == ("50.0", ["20480M", "40960M"])


@pytest.mark.subprocess
async def test_reload_restarts_only_a_changed_daemon_and_adoption_keeps_it(
    short_dir: Path, binary: Path, gpus: str
) -> None:
    mps_root = short_dir / "mps"
    config = short_dir / "config.yaml"
    config.write_text(mps_config(mps_root, replicas=4))
    async with controller(config, binary, gpus=gpus) as running:
        first = await eventually_record(mps_root, lambda r: r.state is DaemonState.READY)
        with running.pipeline.outcomes() as outcomes:
            write(config, mps_config(mps_root, replicas=4) + "# same meaning\n")
            await next_applied(outcomes)
            assert daemon_pid(mps_root) == first.pid

            write(config, mps_config(mps_root, replicas=2))
            await next_applied(outcomes)
        second = await eventually_record(
            mps_root, lambda r: r.state is DaemonState.READY and r.pid != first.pid
        )
        assert first.pid is not None and not process_alive(first.pid)
        assert limits_of(binary, pipe_of(mps_root), 2) == ("50.0", ["20480M", "40960M"])
        assert second.restarts == 0  # replaced on purpose, not a crash

    # mps-control stopped: the daemon keeps serving, and the next one adopts it.
    assert second.pid is not None and process_alive(second.pid)
    log = resource_root(mps_root) / "log" / "control.log"
    starts = log.read_text().count("Startup")
    async with controller(config, binary, gpus=gpus):
        adopted = await eventually_record(
            mps_root, lambda r: r.state is DaemonState.READY and r.updated_at > second.updated_at
        )
        assert adopted.pid == second.pid
        assert log.read_text().count("Startup") == starts


@pytest.mark.subprocess
async def test_a_resource_no_longer_shared_stops_its_daemon(
    short_dir: Path, binary: Path, gpus: str
) -> None:
    mps_root = short_dir / "mps"
    config = short_dir / "config.yaml"
    config.write_text(mps_config(mps_root))
    async with controller(config, binary, gpus=gpus) as running:
        first = await eventually_record(mps_root, lambda r: r.state is DaemonState.READY)
        with running.pipeline.outcomes() as outcomes:
            write(config, f"version: v1\nflags:\n  mpsRoot: {mps_root}\n")
            await next_applied(outcomes)
        assert first.pid is not None and not process_alive(first.pid)
        assert record(mps_root) is None


def prepare_claim(kubelet_dir: Path, resource: str) -> Checkpoint:
    """run-dra's checkpoint with one claim prepared on a device of `resource`, as it writes it."""
    checkpoint = Checkpoint(checkpoint_path(kubelet_dir, DEFAULT_DRIVER))
    device = PublishedDevice(
        name="gpu-0a1b", attributes={"resource": {"string": resource}}, capacity={}
    )
    claim = PreparedClaim(
        ref=ClaimRef("ml", "mps-claim", "uid-1"),
        devices=(PreparedDevice(("gpu",), "node-a", device.name, ("cdi",), share_id="s1"),),
        spec_file="spec.json",
        published=(device,),
    )
    checkpoint.update(lambda claims: claims.update({claim.ref.uid: claim}))
    return checkpoint


@pytest.mark.subprocess
async def test_under_dra_a_daemon_a_prepared_claim_uses_waits_for_its_release(
    short_dir: Path, binary: Path, gpus: str
) -> None:
    mps_root = short_dir / "mps"
    config = short_dir / "config.yaml"
    config.write_text(mps_config(mps_root))
    kubelet_dir = short_dir / "kubelet"
    async with controller(
        config, binary, gpus=gpus, kubelet_dir=kubelet_dir, limits_from_claims=True
    ) as running:
        first = await eventually_record(mps_root, lambda r: r.state is DaemonState.READY)
        # PodResources lists no DRA claims: only run-dra's checkpoint says a client runs here.
        checkpoint = prepare_claim(kubelet_dir, RESOURCE)
        with running.pipeline.outcomes() as outcomes:
            write(config, f"version: v1\nflags:\n  mpsRoot: {mps_root}\n")
            await next_applied(outcomes)
        waiting = await eventually_record(mps_root, lambda r: r.state is DaemonState.WAITING)
        assert waiting.reason is not None and "1 device(s) their claims hold" in waiting.reason
        assert first.pid is not None and process_alive(first.pid)
        checkpoint.update(lambda claims: claims.clear())  # the claim unprepared
        await eventually(lambda: record(mps_root) is None, within=5)
        assert not process_alive(first.pid)


def test_an_unreadable_checkpoint_is_not_taken_for_no_claims(short_dir: Path) -> None:
    checkpoint = prepare_claim(short_dir, RESOURCE)
    assert held_by_resource(checkpoint.peek() or {}) == {RESOURCE: 1}
    checkpoint.path.write_text(checkpoint.path.read_text().replace("uid-1", "uid-2"))
    assert checkpoint.peek() is None  # the checksum does not match: not "nothing held"
    assert checkpoint.path.exists()  # and another process's file is left as it is


@pytest.mark.subprocess
async def test_a_broken_binary_is_retried_and_reported(short_dir: Path, gpus: str) -> None:
    mps_root = short_dir / "mps"
    config = short_dir / "config.yaml"
    config.write_text(mps_config(mps_root))
    async with controller(config, short_dir / "missing", gpus=gpus):
        failed = await eventually_record(mps_root, lambda r: r.state is DaemonState.FAILED)
        assert failed.reason is not None and "cannot run the MPS control binary" in failed.reason


@pytest.mark.subprocess
async def test_sizes_and_limits_from_the_config_reach_the_daemon(
    short_dir: Path, binary: Path, gpus: str
) -> None:
    mps_root = short_dir / "mps"
    config = short_dir / "config.yaml"
    config.write_text(
        f"version: v1\nflags:\n  mpsRoot: {mps_root}\nsharing:\n  mps:\n    resources:\n"
        "    - name: gpu\n      memoryPerReplica: 10Gi\n      activeThreadPercentage: 20\n"
    )
    async with controller(config, binary, gpus=gpus):
        await eventually_record(mps_root, lambda r: r.state is DaemonState.READY)
        assert limits_of(binary, pipe_of(mps_root), 2) == ("20.0", ["10240M", "10240M"])
