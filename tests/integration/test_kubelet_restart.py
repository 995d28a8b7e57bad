"""Kubelet restarts, late kubelets, deleted sockets and PodResources, over real unix sockets."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sharing_plugin.config.model import Config
from sharing_plugin.errors import KubeletError
from sharing_plugin.gpus.holders import Holder
from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.kubelet.podresources import PodResourcesClient
from sharing_plugin.kubelet.server import AllocateContext, ResourceServer
from sharing_plugin.kubelet.watch import KubeletWatcher
from sharing_plugin.observability.metrics import Metrics
from sharing_plugin.plan import Plan
from sharing_plugin.sim.kubelet.simulator import KubeletSimulator

MakePlan = Callable[..., tuple[Plan, Config, Inventory]]
GPU = "nvidia.com/gpu"


def gpu_server(kubelet_dir: Path, make_plan: MakePlan) -> ResourceServer:
    the_plan, cfg, inventory = make_plan({})
    resource = the_plan.resource(GPU)
    assert resource is not None
    return ResourceServer(
        kubelet_dir=kubelet_dir, resource=resource, context=AllocateContext(cfg.flags, inventory)
    )


@asynccontextmanager
async def watching(
    kubelet_dir: Path, server: ResourceServer
) -> AsyncIterator[tuple[list[str], asyncio.Event]]:
    """Run a KubeletWatcher that restarts `server`; yields the log of callbacks it finished
    and an event set after each."""
    calls: list[str] = []
    called = asyncio.Event()

    async def on_restart() -> None:
        await server.restart()
        calls.append("kubelet restarted")
        called.set()

    async def on_removed(path: Path) -> None:
        await server.restart()
        calls.append(f"removed {path.name}")
        called.set()

    watcher = KubeletWatcher(
        kubelet_dir,
        on_restart,
        on_removed,
        own_sockets=lambda: [server.socket_path] if server.socket_path else [],
    )
    task = asyncio.create_task(watcher.run(), name="test:kubelet-watcher")
    try:
        await asyncio.wait_for(watcher.ready.wait(), 5)
        yield calls, called
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_kubelet_restart_reregisters_on_a_new_socket(
    kubelet_sim: KubeletSimulator, make_plan: MakePlan
) -> None:
    server = gpu_server(kubelet_sim.kubelet_dir, make_plan)
    await server.start()
    try:
        await server.register()
        await kubelet_sim.wait_for(lambda: kubelet_sim.allocatable(GPU) == 8)
        old = server.socket_path
        assert old is not None
        async with watching(kubelet_sim.kubelet_dir, server) as (calls, called):
            await kubelet_sim.restart()
            # Kubelet's clean-up (our socket deleted) and its new kubelet.sock usually land in
            # one batch of changes; on a loaded machine they may come as two, each restarting.
            while "kubelet restarted" not in calls:
                called.clear()
                await asyncio.wait_for(called.wait(), 5)
            new = server.socket_path
            assert new is not None and new != old and new.exists()
            assert server.registered
            await kubelet_sim.wait_for(
                lambda: (
                    kubelet_sim.registrations[-1].endpoint == new.name
                    and kubelet_sim.allocatable(GPU) == 8
                )
            )
            pod = await kubelet_sim.admit_pod("p", containers={"c": {GPU: 1}})
            assert pod.device_ids("c", GPU)
    finally:
        await server.stop()
    assert not list(kubelet_sim.plugin_dir.glob("sharing-*"))


async def test_a_deleted_socket_is_replaced_and_registered_again(
    kubelet_sim: KubeletSimulator, make_plan: MakePlan
) -> None:
    server = gpu_server(kubelet_sim.kubelet_dir, make_plan)
    await server.start()
    try:
        await server.register()
        await kubelet_sim.wait_for(lambda: kubelet_sim.allocatable(GPU) == 8)
        old = server.socket_path
        assert old is not None
        async with watching(kubelet_sim.kubelet_dir, server) as (calls, called):
            old.unlink()
            await asyncio.wait_for(called.wait(), 5)
            new = server.socket_path
            assert new is not None and new != old
            assert kubelet_sim.registrations[-1].endpoint == new.name
            assert calls == [f"removed {old.name}"]
            await kubelet_sim.wait_for(lambda: kubelet_sim.allocatable(GPU) == 8)
    finally:
        await server.stop()


async def test_kubelet_started_after_the_plugin(short_dir: Path, make_plan: MakePlan) -> None:
    kubelet_dir = short_dir / "kl"  # not even the directory exists yet
    server = gpu_server(kubelet_dir, make_plan)
    await server.start()  # listens already: kubelet's start-up cleanup will delete this socket
    try:
        # Refused while kubelet is absent; the supervisor retries it with backoff.
        with pytest.raises(KubeletError, match="kubelet"):
            await server.register()
        assert not server.registered
        async with KubeletSimulator(kubelet_dir, grace_period=0.2, dial_timeout=2.0) as kubelet:
            await server.register()  # the retry, once kubelet listens
            assert server.registered
            await kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 8)
            assert server.socket_path is not None and server.socket_path.exists()
            assert kubelet.registrations[0].endpoint == server.socket_path.name
    finally:
        await server.stop()


async def test_the_watcher_waits_for_a_missing_directory(
    short_dir: Path, make_plan: MakePlan
) -> None:
    kubelet_dir = short_dir / "late"
    server = gpu_server(kubelet_dir, make_plan)
    calls: list[str] = []

    async def on_restart() -> None:
        calls.append("restart")
        await server.restart()

    async def on_removed(path: Path) -> None:
        calls.append("removed")

    watcher = KubeletWatcher(kubelet_dir, on_restart, on_removed, own_sockets=lambda: [])
    task = asyncio.create_task(watcher.run(), name="test:kubelet-watcher")
    try:
        async with KubeletSimulator(kubelet_dir, grace_period=0.2, dial_timeout=2.0) as kubelet:
            await asyncio.wait_for(watcher.ready.wait(), 5)
            await kubelet.restart()
            await kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 8)
            assert calls == ["restart"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await server.stop()


def unanswered(metrics: Metrics) -> float:
    text = metrics.render().decode()
    return next(
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "sharing_plugin_podresources_errors_total"
    )


async def test_pod_resources_reports_held_devices_and_tolerates_absence(
    short_dir: Path, make_plan: MakePlan
) -> None:
    metrics = Metrics()
    client = PodResourcesClient(short_dir, metrics=metrics)
    try:
        assert await client.held_devices() is None  # no kubelet: tolerated
        assert await client.held_by() is None
        assert unanswered(metrics) == 2  # each call counted, though logged once
        server = gpu_server(short_dir, make_plan)
        async with KubeletSimulator(short_dir, grace_period=0.2, dial_timeout=2.0) as kubelet:
            await server.start()
            try:
                await server.register()
                await kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 8)
                assert await client.held_devices() == {}
                pod = await kubelet.admit_pod(
                    "p", "team", containers={"c": {GPU: 2}, "sidecar": {}}
                )
                ids = pod.device_ids("c", GPU)
                assert await client.held_devices() == {GPU: frozenset(ids)}
                assert await client.held_by() == dict.fromkeys(ids, Holder("team", "p", "c"))
                kubelet.delete_pod("p", "team")
                assert await client.held_devices() == {}
                assert unanswered(metrics) == 2
            finally:
                await server.stop()
        assert await client.held_devices() is None  # kubelet gone again
        assert unanswered(metrics) == 3
        # A socket nobody listens on (a killed kubelet): the call itself fails.
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
            dead.bind(str(client.socket))
            assert await client.held_devices() is None
        assert unanswered(metrics) == 4
    finally:
        await client.close()
