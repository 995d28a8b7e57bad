"""GPU health end to end: simulated Xids and lost GPUs -> the daemon -> kubelet's allocatable.

Faults reach the daemon the way an admin would inject them on a test node: appended to the
simulated node file's `faults` list (or, where the test holds the simulator, injected into it).
Faults are injected once the daemon's Xid watch is up (an Xid before it is lost, as with
NVML); every other wait is on what kubelet sees, and an "ignored" fault is shown to be ignored
by a later fault that is handled after it, never by sleeping.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import Running, append_fault, node_file, running
from support.observe import health_monitor, inject_xid, next_applied, set_lost

from sharing_plugin.daemon.node.health_monitor import HealthEnv
from sharing_plugin.sim.kubelet.admission import AdmissionError

GPU = "nvidia.com/gpu"
SHARED = "nvidia.com/gpu.shared"
MIG_1G = "nvidia.com/mig-1g.10gb"

# Four whole A100s: GPUs 0-1 serve nvidia.com/gpu, GPUs 2-3 the renamed nvidia.com/gpu.shared.
WHOLE_NODE: dict[str, Any] = {
    "name": "health-node",
    "gpus": [{"product": "NVIDIA A100-SXM4-80GB", "count": 4, "numaNode": 0}],
    "nvlink": "all",
    "faults": [],
}
# GPUs 0-1 whole, GPUs 2-3 each split into 3g.40gb + 2g.20gb + 1g.10gb: with the mixed strategy
# GPU 2 backs three resources.
MIG_NODE: dict[str, Any] = {
    "name": "health-mig-node",
    "gpus": [
        {"product": "NVIDIA A100-SXM4-80GB", "count": 2, "numaNode": 0},
        {
            "product": "NVIDIA A100-SXM4-80GB",
            "count": 2,
            "numaNode": 1,
            "mig": {"instances": ["3g.40gb", "2g.20gb", "1g.10gb@6"]},
        },
    ],
    "nvlink": "all",
    "faults": [],
}

SPLIT = """\
version: v1
sharing:
  timeSlicing:
    resources:
      - name: gpu
        devices: [0, 1]
        replicas: 2
      - name: gpu
        rename: gpu.shared
        devices: [2, 3]
        replicas: 3
"""
MIG_MIXED = """\
version: v1
flags:
  migStrategy: mixed
sharing:
  timeSlicing:
    resources:
      - name: nvidia.com/mig-1g.10gb
        replicas: 2
"""
SHARED_ALL = """\
version: v1
sharing:
  timeSlicing:
    resources:
      - name: gpu
        replicas: 2
"""
FAST_RECOVERY = """\
health:
  recoveryQuietPeriodSeconds: 1
  recoveryCheckSeconds: 1
  recoveryCheckMaxSeconds: 1
"""


def unhealthy(run: Running) -> dict[str, set[str]]:
    """Resource -> the device IDs kubelet sees as not Healthy, for every resource."""
    return {
        r: {i for i, h in run.kubelet.devices(r).items() if h != "Healthy"}
        for r in run.kubelet.resources()
    }


def backed_by(run: Running, uuid: str) -> dict[str, set[str]]:
    """Resource -> the advertised device IDs on `uuid` (a GPU, with its MIG devices, or one
    MIG device), for every resource."""
    plan = run.daemon.supervisor.advertised
    assert plan is not None
    return {
        r.name: {d.id for d in r.devices if uuid in (d.physical, d.gpu_uuid)}
        for r in plan.resources
    }


def gpu_uuid(run: Running, index: int) -> str:
    uuid: str = run.nvml.gpus[index].uuid
    return uuid


async def health_watch(run: Running) -> None:
    """Wait until the daemon's Xid watch is registered: an Xid from before has no event set
    to land in and is lost, as with NVML (the simulator drops it the same way)."""
    monitor = health_monitor(run.daemon.pipeline)
    assert monitor is not None
    await asyncio.wait_for(monitor.watching.wait(), 2.0)


def healthy_counts(run: Running) -> dict[str, int]:
    resources = run.daemon.status.to_json()["resources"]
    return {name: r["healthy"] for name, r in resources.items()}


async def test_xid_in_the_node_file_drops_every_device_of_that_gpu_within_a_second(
    short_dir: Path,
) -> None:
    node = node_file(short_dir, WHOLE_NODE)
    async with running(short_dir, SPLIT, gpus=f"simulated:{node}") as run:
        await health_watch(run)
        assert run.capacity() == {GPU: 4, SHARED: 6}
        expected = backed_by(run, gpu_uuid(run, 2))
        assert expected == {GPU: set(), SHARED: expected[SHARED]}
        assert len(expected[SHARED]) == 3
        loop = asyncio.get_running_loop()
        started = loop.time()
        append_fault(node, {"gpu": 2, "xid": 79})
        await run.kubelet.wait_for(lambda: unhealthy(run) == expected, timeout=1.0)
        assert loop.time() - started < 1.0
        assert run.allocatable() == {GPU: 4, SHARED: 3}
        assert run.capacity() == {GPU: 4, SHARED: 6}
        assert healthy_counts(run) == {GPU: 4, SHARED: 3}


async def test_gpu_xid_on_a_mig_node_drops_every_mig_resource_it_backs(short_dir: Path) -> None:
    node = node_file(short_dir, MIG_NODE)
    async with running(short_dir, MIG_MIXED, gpus=f"simulated:{node}") as run:
        await health_watch(run)
        before = run.allocatable()
        expected = backed_by(run, gpu_uuid(run, 2))
        on_gpu_2 = {r for r, ids in expected.items() if ids}
        assert on_gpu_2 == {"nvidia.com/mig-3g.40gb", "nvidia.com/mig-2g.20gb", MIG_1G}
        assert len(expected[MIG_1G]) == 2  # both replicas of its 1g.10gb
        append_fault(node, {"gpu": 2, "xid": 79})
        await run.kubelet.wait_for(lambda: unhealthy(run) == expected, timeout=1.0)
        assert run.allocatable() == {r: n - len(expected[r]) for r, n in before.items()}
        assert run.allocatable()[GPU] == 2


async def test_mig_scoped_xid_affects_only_that_mig_device_and_its_replicas(
    short_dir: Path,
) -> None:
    node = node_file(short_dir, MIG_NODE)
    async with running(short_dir, MIG_MIXED, gpus=f"simulated:{node}") as run:
        await health_watch(run)
        small = next(
            ci for ci in run.nvml.gpus[2].mig_devices() if ci.gpu_instance.spec.name == "1g.10gb"
        )
        expected = backed_by(run, small.uuid)
        assert {r for r, ids in expected.items() if ids} == {MIG_1G}
        assert len(expected[MIG_1G]) == 2
        append_fault(node, {"gpu": small.uuid, "xid": 94})
        await run.kubelet.wait_for(lambda: unhealthy(run) == expected, timeout=1.0)
        assert run.allocatable()[MIG_1G] == 2  # GPU 3's 1g.10gb, time-sliced twice
        assert run.allocatable()["nvidia.com/mig-3g.40gb"] == 2


async def test_an_ignored_xid_changes_nothing(short_dir: Path) -> None:
    node = node_file(short_dir, WHOLE_NODE)
    async with running(short_dir, SHARED_ALL, gpus=f"simulated:{node}") as run:
        await health_watch(run)
        inject_xid(run.nvml, 2, 13)
        # Events are handled in order: once GPU 3's Xid shows, GPU 2's Xid 13 was handled.
        inject_xid(run.nvml, 3, 79)
        expected = backed_by(run, gpu_uuid(run, 3))
        await run.kubelet.wait_for(lambda: unhealthy(run) == expected, timeout=1.0)
        assert run.daemon.pipeline.health[gpu_uuid(run, 2)]
        assert run.allocatable() == {GPU: 6}
        # Why GPU 3 is Unhealthy reaches the pipeline's consumers beside the health mapping.
        assert {u: f.reason for u, f in run.daemon.pipeline.faults.items()} == {
            gpu_uuid(run, 3): "xid-79"
        }


async def test_a_lost_gpu_is_unhealthy_until_it_answers_again(short_dir: Path) -> None:
    node = node_file(short_dir, WHOLE_NODE)
    async with running(short_dir, SHARED_ALL + FAST_RECOVERY, gpus=f"simulated:{node}") as run:
        await health_watch(run)
        expected = backed_by(run, gpu_uuid(run, 1))
        append_fault(node, {"gpu": 1, "lost": True})
        await run.kubelet.wait_for(lambda: unhealthy(run) == expected, timeout=1.0)
        assert run.allocatable() == {GPU: 6}
        # A lost GPU delivers Xid 79 (fallen off the bus) before its queries fail.
        assert {u: f.reason for u, f in run.daemon.pipeline.faults.items()} == {
            gpu_uuid(run, 1): "xid-79"
        }
        append_fault(node, {"gpu": 1, "lost": False})
        await run.kubelet.wait_for(lambda: run.allocatable() == {GPU: 8}, timeout=4.0)
        assert run.daemon.pipeline.faults == {}


async def test_a_gpu_lost_through_the_simulator_is_unhealthy(short_dir: Path) -> None:
    async with running(short_dir, SHARED_ALL, gpus="simulated:t4x4") as run:
        await health_watch(run)
        set_lost(run.nvml, 1)
        expected = backed_by(run, gpu_uuid(run, 1))
        await run.kubelet.wait_for(lambda: unhealthy(run) == expected, timeout=1.0)
        assert not run.daemon.pipeline.health[gpu_uuid(run, 1)]


async def test_recovery_after_the_quiet_period_restores_allocatable_and_status(
    short_dir: Path,
) -> None:
    node = node_file(short_dir, WHOLE_NODE)
    async with running(short_dir, SPLIT + FAST_RECOVERY, gpus=f"simulated:{node}") as run:
        await health_watch(run)
        append_fault(node, {"gpu": 2, "xid": 79})
        await run.kubelet.wait_for(lambda: run.allocatable() == {GPU: 4, SHARED: 3}, timeout=1)
        assert healthy_counts(run) == {GPU: 4, SHARED: 3}
        loop = asyncio.get_running_loop()
        failed = loop.time()
        await run.kubelet.wait_for(lambda: run.allocatable() == {GPU: 4, SHARED: 6}, timeout=3)
        assert loop.time() - failed < 2.5
        assert unhealthy(run) == {GPU: set(), SHARED: set()}
        assert healthy_counts(run) == {GPU: 4, SHARED: 6}
        assert all(run.daemon.pipeline.health.values())


async def test_a_pod_admitted_during_the_outage_gets_no_device_of_the_failed_gpu(
    short_dir: Path,
) -> None:
    node = node_file(short_dir, WHOLE_NODE)
    async with running(short_dir, SHARED_ALL, gpus=f"simulated:{node}") as run:
        await health_watch(run)
        failed = backed_by(run, gpu_uuid(run, 2))[GPU]
        append_fault(node, {"gpu": 2, "xid": 79})
        await run.kubelet.wait_for(lambda: run.allocatable() == {GPU: 6}, timeout=1.0)
        with pytest.raises(AdmissionError, match="Requested: 7, Available: 6"):
            await run.kubelet.admit_pod("greedy", containers={"c": {GPU: 7}})
        pod = await run.kubelet.admit_pod("p", containers={"c": {GPU: 6}})
        granted = pod.device_ids("c", GPU)
        assert len(granted) == 6 and not set(granted) & failed
        visible = pod.get("c", GPU).response.envs["NVIDIA_VISIBLE_DEVICES"].split(",")
        assert gpu_uuid(run, 2) not in visible


async def test_health_disabled_in_the_config_ignores_xids_until_enabled(short_dir: Path) -> None:
    node = node_file(short_dir, WHOLE_NODE)
    disabled = SHARED_ALL + "health:\n  enabled: false\n"
    async with running(short_dir, disabled, gpus=f"simulated:{node}") as run:
        append_fault(node, {"gpu": 2, "xid": 79})
        with run.daemon.pipeline.outcomes() as outcomes:
            run.write(SHARED_ALL)
            await next_applied(outcomes)
        await health_watch(run)
        # With checks off nothing watched GPU 2's Xid; the one after enabling is seen alone.
        append_fault(node, {"gpu": 3, "xid": 79})
        expected = backed_by(run, gpu_uuid(run, 3))
        await run.kubelet.wait_for(lambda: unhealthy(run) == expected, timeout=1.0)
        # Turning checks off again reports every device Healthy.
        run.write(disabled)
        await run.kubelet.wait_for(lambda: run.allocatable() == {GPU: 8}, timeout=1.0)
        assert healthy_counts(run) == {GPU: 8}


async def test_dp_disable_healthchecks_all_ignores_xids(short_dir: Path) -> None:
    env = HealthEnv.from_environ({"DP_DISABLE_HEALTHCHECKS": "all"})
    node = node_file(short_dir, WHOLE_NODE)
    async with running(short_dir, SHARED_ALL, gpus=f"simulated:{node}", health_env=env) as run:
        monitor = health_monitor(run.daemon.pipeline)
        assert monitor is not None and not monitor.settings.enabled
        inject_xid(run.nvml, 2, 79)
        set_lost(run.nvml, 3)
        append_fault(node, {"gpu": 1, "xid": 79})
        # A reload pushes the plan again: it still holds every device Healthy.
        run.write(SHARED_ALL.replace("replicas: 2", "replicas: 3"))
        await run.kubelet.wait_for(lambda: run.capacity() == {GPU: 12}, timeout=2.0)
        assert run.allocatable() == {GPU: 12}
        assert not monitor.watching.is_set()


async def test_dp_disable_healthchecks_list_adds_ignored_xids(short_dir: Path) -> None:
    env = HealthEnv.from_environ({"DP_DISABLE_HEALTHCHECKS": "79"})
    async with running(short_dir, SHARED_ALL, gpus="simulated:t4x4", health_env=env) as run:
        await health_watch(run)
        inject_xid(run.nvml, 2, 79)
        inject_xid(run.nvml, 3, 48)
        expected = backed_by(run, gpu_uuid(run, 3))
        await run.kubelet.wait_for(lambda: unhealthy(run) == expected, timeout=1.0)
        assert run.allocatable() == {GPU: 6}
