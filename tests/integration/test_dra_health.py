"""run-dra and GPU health: an Unhealthy GPU stays in the pool with a NoSchedule taint naming the
fault (where the server keeps taints), recovery removes it, the kubelet hears each device's
health over NodeWatchResources on the DRA socket; a server without taints gets the old rule."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
from daemon_harness import append_fault, node_file
from dra_harness import DRIVER, NODE, DraRun, dra_running, foreign_claim
from kube_api import FakeKubeApi
from support.observe import health_monitor, wait_published

from sharing_plugin.dra.api.constants import HEALTH_V1ALPHA1_SERVICE, V1BETA1_SERVICE
from sharing_plugin.dra.api.dra_health.v1alpha1 import api_pb2 as health
from sharing_plugin.dra.api.dra_health.v1alpha1 import api_pb2_grpc as health_grpc
from sharing_plugin.dra.health import DeviceHealthServicer
from sharing_plugin.views.dra_api import PublishedDevice
from sharing_plugin.views.dra_health import DeviceHealth

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
    monitor = health_monitor(run.daemon.pipeline)
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
        tainted = await wait_published(run.keeper, lambda d: bool(taints(d)), timeout=1.0)
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
        back = await wait_published(run.keeper, lambda d: not taints(d), timeout=5.0)
        assert {d.name for d in back} == {d.name for d in devices}
        assert not any(d.get("taints") for s in run.slices() for d in s["spec"]["devices"])


async def test_a_claim_allocated_a_tainted_device_is_prepared(short_dir: Path) -> None:
    node = node_file(short_dir, TWO_GPUS)
    async with dra_running(short_dir, shared(2), gpus=f"simulated:{node}") as run:
        devices = await run.published(4)
        await watching(run)
        sick = uuid_of(devices, 0)
        append_fault(node, {"gpu": sick, "xid": 79})
        await wait_published(run.keeper, lambda d: bool(taints(d)), timeout=1.0)
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
        api.dra_features_off = frozenset({"DRADeviceTaints"})  # 1.34-1.35 defaults
        async with dra_running(
            short_dir, shared(2) + RECOVERY, gpus=f"simulated:{node}", api=api
        ) as run:
            devices = await run.published(4)
            await watching(run)
            sick = uuid_of(devices, 0)
            append_fault(node, {"gpu": sick, "xid": 79})
            left = await wait_published(run.keeper, lambda d: len(d) == 2, timeout=1.0)
            assert sick not in {d.attributes["uuid"]["string"] for d in left}
            assert not taints(left)
            assert len(run.device_names()) == 2  # and no probe slice left from the start
            # A claim allocated it before the fault is not prepared on it.
            name = next(d.name for d in devices if d.attributes["uuid"]["string"] == sick)
            ref = foreign_claim(run.api, "before-the-fault", name, pool=NODE)
            assert "is unhealthy" in (await run.prepare(ref)).error
            await run.published(4, timeout=5.0)


async def test_taints_the_server_stops_keeping_make_an_unhealthy_gpu_leave_the_pool(
    short_dir: Path,
) -> None:
    node = node_file(short_dir, TWO_GPUS)
    async with (
        FakeKubeApi() as api,
        dra_running(short_dir, shared(2) + RECOVERY, gpus=f"simulated:{node}", api=api) as run,
    ):
        devices = await run.published(4)
        await watching(run)
        # The probe at start found taints kept; the gate is turned off since (an API
        # server restarted with DRADeviceTaints=false): what it stores is read back.
        api.dra_features_off = frozenset({"DRADeviceTaints"})
        sick = uuid_of(devices, 0)
        append_fault(node, {"gpu": sick, "xid": 79})
        left = await wait_published(run.keeper, lambda d: len(d) == 2, timeout=2.0)
        assert sick not in {d.attributes["uuid"]["string"] for d in left}
        stored = [d for s in run.slices() for d in s["spec"]["devices"]]
        assert len(stored) == 2 and not any("taints" in d for d in stored)


async def test_a_claim_on_a_tainted_dynamic_placement_is_prepared(short_dir: Path) -> None:
    node = node_file(short_dir, {"gpus": [{"product": "NVIDIA A100-SXM4-80GB", "count": 1}]})
    config = "version: v1\npartitioning:\n  mig:\n    - devices: all\n      dynamic: true\n"
    async with dra_running(short_dir, config + RECOVERY, gpus=f"simulated:{node}") as run:
        devices = await run.published(25)
        await watching(run)
        sick = devices[0].attributes["uuid"]["string"]
        append_fault(node, {"gpu": sick, "xid": 79})
        await wait_published(run.keeper, lambda d: bool(taints(d)), timeout=1.0)
        # Allocated the tainted placement (it tolerates the taint): prepared, instance made.
        ref = foreign_claim(run.api, "tolerates", devices[0].name, pool=NODE)
        answer = await run.prepare(ref)
        assert answer.error == "" and len(answer.devices) == 1


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
        left = await wait_published(run.keeper, lambda d: len(d) == 2, timeout=1.0)
        assert not taints(left)


@asynccontextmanager
async def health_stream(run: DraRun) -> AsyncIterator[Any]:
    """NodeWatchResources on the plugin's DRA socket, as the kubelet opens it."""
    channel = run.kubelet.plugins[DRIVER].channel
    call = health_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
        health.NodeWatchResourcesRequest()
    )
    try:
        yield call
    finally:
        call.cancel()


def by_name(message: Any) -> dict[str, tuple[int, str]]:
    return {d.device.device_name: (d.health, d.message) for d in message.devices}


async def test_the_kubelet_hears_every_devices_health_at_once_and_on_every_change(
    short_dir: Path,
) -> None:
    node = node_file(short_dir, TWO_GPUS)
    async with dra_running(short_dir, shared(2) + RECOVERY, gpus=f"simulated:{node}") as run:
        devices = await run.published(4)
        await watching(run)
        (registered,) = [e for e in run.kubelet.events if e["call"] == "register"]
        assert HEALTH_V1ALPHA1_SERVICE in registered["versions"]
        async with health_stream(run) as stream:
            first = await asyncio.wait_for(stream.read(), 2)
            assert {d.device.pool_name for d in first.devices} == {NODE}
            assert by_name(first) == {d.name: (health.HEALTHY, "") for d in devices}
            assert all(d.health_check_timeout_seconds == 180 for d in first.devices)
            sick = run.nvml.gpus[1].uuid
            append_fault(node, {"gpu": 1, "xid": 79})
            second = await asyncio.wait_for(stream.read(), 2)
            unhealthy = {n: v for n, v in by_name(second).items() if v[0] == health.UNHEALTHY}
            expected = {d.name for d in devices if d.attributes["uuid"]["string"] == sick}
            assert set(unhealthy) == expected
            assert {m for _, m in unhealthy.values()} == {f"{sick}: Xid 79"}
            third = await asyncio.wait_for(stream.read(), 5)  # recovered after 1 s quiet
            assert by_name(third) == by_name(first)


async def test_an_unchanged_list_is_sent_again_before_the_kubelets_timeout(
    short_dir: Path,
) -> None:
    servicer = DeviceHealthServicer(pool="node-a", resend_s=0.05, timeout_s=7, clock=lambda: 42)
    servicer.publish([DeviceHealth("gpu-a", True), DeviceHealth("gpu-b", False, "GPU-b: Xid 79")])
    server = grpc.aio.server()
    health_grpc.add_DRAResourceHealthServicer_to_server(servicer, server)
    path = short_dir / "health.sock"
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"unix://{path}") as channel:
            stub = health_grpc.DRAResourceHealthStub(channel)
            call = stub.NodeWatchResources(health.NodeWatchResourcesRequest())
            first = await asyncio.wait_for(call.read(), 2)
            again = await asyncio.wait_for(call.read(), 2)  # nothing changed in between
            assert again == first
            assert [
                (d.last_updated_time, d.health_check_timeout_seconds) for d in first.devices
            ] == [
                (42, 7),
                (42, 7),
            ]
            servicer.publish([DeviceHealth("gpu-a", True)])  # a change is sent at once
            # Resends of the old list already on their way may come first (one each 0.05 s).
            changed = await asyncio.wait_for(call.read(), 2)
            while changed == first:
                changed = await asyncio.wait_for(call.read(), 2)
            assert [d.device.device_name for d in changed.devices] == ["gpu-a"]
            call.cancel()
    finally:
        await server.stop(None)
