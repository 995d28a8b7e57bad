"""run-dra and GPU health: an Unhealthy GPU stays in the pool with a NoSchedule taint naming the
fault (where the server keeps taints), recovery removes it, the kubelet hears each device's
health over NodeWatchResources on the DRA socket; a server without taints gets the old rule."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from daemon_harness import append_fault, node_file
from dra_harness import DRIVER, NODE, DraRun, dra_running, foreign_claim
from kube_api import FakeKubeApi

from sharing_plugin.dra.api.constants import V1BETA1_SERVICE
from sharing_plugin.views.dra_api import PublishedDevice

SHARED = "nvidia.com/gpu.shared"
TAINT = "gpu.sharing-plugin.io/unhealthy"
TWO_GPUS: dict[str, Any] = {
    "gpus": [{"product": "NVIDIA A100-SXM4-80GB", "count": 2}],
    "faults": [],
}
RECOVERY = "health:\n  recoveryQuietPeriodSeconds: 1\n  recoveryCheckSeconds: 1\n"


def shared(replicas: int) -> str:
    """Time-slicing, one DRA device per replica (the test allocator knows that model only)."""
    return (
        "version: v1\ndra:\n  sharedDevices: replicas\nsharing:\n  timeSlicing:\n"
        "    renameByDefault: true\n    resources:\n      - name: gpu\n"
        f"        replicas: {replicas}\n"
    )


def taints(devices: tuple[PublishedDevice, ...]) -> dict[str, list[tuple[str, str, str]]]:
    return {d.name: [(t.key, t.value, t.effect) for t in d.taints] for d in devices if d.taints}


async def watching(run: DraRun) -> None:
    monitor = run.daemon.pipeline.health_monitor
    assert monitor is not None
    async with asyncio.timeout(2):
        await monitor.watching.wait()


def uuid_of(devices: tuple[PublishedDevice, ...], gpu: int) -> str:
    return sorted({str(d.attributes["uuid"]["string"]) for d in devices})[gpu]


async def test_an_unhealthy_gpu_stays_in_the_pool_tainted_until_it_recovers(
    short_dir: Path,
) -> None:
    node = node_file(short_dir, TWO_GPUS)
    async with dra_running(short_dir, shared(2) + RECOVERY, gpus=f"simulated:{node}") as run:
        devices = await run.published(4)
        await watching(run)
        sick = run.nvml.gpus[0].uuid
        append_fault(node, {"gpu": 0, "xid": 79})
        tainted = await run.keeper.wait_published(lambda d: bool(taints(d)), timeout=1.0)
        assert len(tainted) == 4  # nobody left the pool
        names = {d.name for d in tainted if d.attributes["uuid"]["string"] == sick}
        assert taints(tainted) == {n: [(TAINT, "xid-79", "NoSchedule")] for n in names}
        # What the API holds carries it; /status counts the tainted devices as not healthy.
        stored = {d["name"]: d.get("taints") for s in run.slices() for d in s["spec"]["devices"]}
        assert {n for n, t in stored.items() if t} == names
        assert all(t[0]["value"] == "xid-79" for t in stored.values() if t)
        status = run.daemon.status.to_json()["resources"][SHARED]
        assert (status["devices"], status["healthy"]) == (4, 2)
        # Recovery (quiet for 1 s, NVML answers) removes the taint.
        back = await run.keeper.wait_published(lambda d: not taints(d), timeout=5.0)
        assert {d.name for d in back} == {d.name for d in devices}
        assert not any(d.get("taints") for s in run.slices() for d in s["spec"]["devices"])


async def test_a_claim_allocated_a_tainted_device_is_prepared(short_dir: Path) -> None:
    node = node_file(short_dir, TWO_GPUS)
    async with dra_running(short_dir, shared(2), gpus=f"simulated:{node}") as run:
        devices = await run.published(4)
        await watching(run)
        sick = uuid_of(devices, 0)
        append_fault(node, {"gpu": sick, "xid": 79})
        await run.keeper.wait_published(lambda d: bool(taints(d)), timeout=1.0)
        # Allocated the tainted device (the test allocator plays a scheduler that saw it
        # tolerated, or allocated it just before the taint): NoSchedule keeps such claims.
        on_sick = f'device.attributes["{DRIVER}"].uuid == "{sick}"'
        ref = run.claim("tolerates", SHARED, selectors=[on_sick])
        answer = await run.prepare(ref)
        assert answer.error == "" and len(answer.devices) == 1


async def test_without_taints_on_the_server_an_unhealthy_gpu_leaves_the_pool(
    short_dir: Path,
) -> None:
    node = node_file(short_dir, TWO_GPUS)
    async with FakeKubeApi() as api:
        api.device_taints = False  # a 1.34-1.35 server with DRADeviceTaints off
        async with dra_running(
            short_dir, shared(2) + RECOVERY, gpus=f"simulated:{node}", api=api
        ) as run:
            devices = await run.published(4)
            await watching(run)
            sick = uuid_of(devices, 0)
            append_fault(node, {"gpu": sick, "xid": 79})
            left = await run.keeper.wait_published(lambda d: len(d) == 2, timeout=1.0)
            assert sick not in {d.attributes["uuid"]["string"] for d in left}
            assert not taints(left)
            assert len(run.device_names()) == 2  # and no probe slice left from the start
            # A claim allocated it before the fault is not prepared on it.
            name = next(d.name for d in devices if d.attributes["uuid"]["string"] == sick)
            ref = foreign_claim(run.api, "before-the-fault", name, pool=NODE)
            assert "is unhealthy" in (await run.prepare(ref)).error
            await run.published(4, timeout=5.0)


async def test_a_v1beta1_server_gets_no_taints_and_no_probe(short_dir: Path) -> None:
    node = node_file(short_dir, TWO_GPUS)
    async with dra_running(
        short_dir,
        shared(2),
        gpus=f"simulated:{node}",
        versions=("v1beta1",),
        kubelet_services=(V1BETA1_SERVICE,),
    ) as run:
        await run.published(4)
        await watching(run)
        append_fault(node, {"gpu": 1, "xid": 79})
        left = await run.keeper.wait_published(lambda d: len(d) == 2, timeout=1.0)
        assert not taints(left)
