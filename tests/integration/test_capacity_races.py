"""Capacity never lies, in the moments where it used to (issue 16): a grant racing a reload,
an Allocate just after a shrink, the first plan after a restart, and a killed run's sockets.

The races are opened deterministically with the simulator's gates: a PodResources answer held
back after it was taken, and an admission held between the pick and Allocate.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from daemon_harness import Running, eventually, run_options, running
from prometheus_client.parser import text_string_to_metric_families
from support.configs import sliced
from support.observe import messages_received

from sharing_plugin.backends import backend_from_spec
from sharing_plugin.daemon.run.app import NodeDevicePlugin
from sharing_plugin.sim.kubelet.simulator import AdmissionError, KubeletSimulator

GPU = "nvidia.com/gpu"
PR_ERRORS = "sharing_plugin_podresources_errors"


def unhealthy(kubelet: KubeletSimulator, resource: str = GPU) -> set[str]:
    return {i for i, h in kubelet.devices(resource).items() if h != "Healthy"}


def holds_are_advertised(kubelet: KubeletSimulator) -> bool:
    return all(
        set(a.device_ids) <= set(kubelet.devices(a.resource))
        for pod in kubelet.pods.values()
        for a in pod.allocations
    )


async def drained_and_released(run: Running, pod: str, expected: int) -> None:
    run.kubelet.delete_pod(pod)
    await run.kubelet.wait_for(lambda: run.kubelet.capacity(GPU) == expected, timeout=5)
    await run.settled()
    assert run.allocatable() == {GPU: expected}
    assert run.daemon.status.to_json()["resources"][GPU]["draining"] == []


async def test_replica_granted_while_pod_resources_answers_stays_draining(
    short_dir: Path,
) -> None:
    """Defect 1: the held devices were read, then a grant from the old snapshot slipped in
    before the swap, and the shrink dropped that replica while the pod held it."""
    # The pod is deleted before any PodResources answer lists it: its grants count as held
    # until the grant window ends (shortened from 2 s; kubelet here records a grant at once).
    async with running(short_dir, sliced(4), grant_window_s=0.5) as run:
        gate = run.kubelet.pod_resources_hold
        gate.close()
        run.write(sliced(2))
        # The reload has kubelet's answer (no pod yet) on its way; Allocate still serves 4.
        await run.kubelet.wait_for(lambda: gate.waiting == 1)
        pod = await run.kubelet.admit_pod("p", containers={"c": {GPU: 32}})
        gate.open()
        dropped = {i for i in pod.device_ids("c", GPU) if i.endswith(("::2", "::3"))}
        assert len(dropped) == 16
        await run.kubelet.wait_for(
            lambda: run.kubelet.capacity(GPU) == 32 and run.kubelet.allocatable(GPU) == 16,
            timeout=3,
        )
        await run.settled()
        assert holds_are_advertised(run.kubelet)
        assert unhealthy(run.kubelet) == dropped
        assert set(run.daemon.status.to_json()["resources"][GPU]["draining"]) == dropped
        await drained_and_released(run, "p", 16)


async def test_allocate_of_a_replica_withdrawn_a_moment_ago_is_honoured_and_drains(
    short_dir: Path,
) -> None:
    """Defect 2: kubelet picked replicas it saw Healthy, the shrink arrived, and the Allocate
    that followed was refused: the pod failed admission."""
    async with running(short_dir, sliced(4)) as run:
        gate = run.kubelet.allocate_hold
        gate.close()
        admission = asyncio.create_task(run.kubelet.admit_pod("p", containers={"c": {GPU: 32}}))
        await run.kubelet.wait_for(lambda: gate.waiting == 1)  # picked all 32, not asked yet
        run.write(sliced(2))
        await run.kubelet.wait_for(lambda: run.kubelet.capacity(GPU) == 16)
        gate.open()
        pod = await admission
        dropped = {i for i in pod.device_ids("c", GPU) if i.endswith(("::2", "::3"))}
        assert len(dropped) == 16
        await run.kubelet.wait_for(
            lambda: run.kubelet.capacity(GPU) == 32 and run.kubelet.allocatable(GPU) == 16,
            timeout=3,
        )
        await run.settled()
        assert holds_are_advertised(run.kubelet)
        assert unhealthy(run.kubelet) == dropped
        # The honoured replicas are the pod's now: nobody else is given them meanwhile.
        with pytest.raises(AdmissionError, match="Available: 0"):
            await run.kubelet.admit_pod("q", containers={"c": {GPU: 1}})
        await drained_and_released(run, "p", 16)


def unanswered(run: Running) -> float:
    """PodResources calls the daemon made that got no answer, as its metrics count them."""
    text = run.daemon.metrics.render().decode()
    (family,) = (f for f in text_string_to_metric_families(text) if f.name == PR_ERRORS)
    (sample,) = family.samples
    return sample.value


async def test_draining_devices_stay_while_pod_resources_cannot_answer(
    short_dir: Path,
) -> None:
    """Found by the invariant test: a kubelet restarting (PodResources gone for a moment) made
    every draining device vanish at the next recheck while pods still held them."""
    async with running(short_dir, sliced(4)) as run:
        pod = await run.kubelet.admit_pod("p", containers={"c": {GPU: 32}})
        dropped = {i for i in pod.device_ids("c", GPU) if i.endswith(("::2", "::3"))}
        run.write(sliced(2))
        await run.kubelet.wait_for(lambda: unhealthy(run.kubelet) == dropped, timeout=3)
        before = unanswered(run)
        run.kubelet.pod_resources_socket.unlink()  # kubelet cannot answer for now
        await eventually(lambda: unanswered(run) > before, within=3)
        messages = messages_received(run.kubelet, GPU)
        # Several drain rechecks (every 0.05 s here) ask and get no answer; a plugin that lost
        # the draining devices would stop rechecking, so their going ends the wait too.
        await eventually(
            lambda: unanswered(run) >= before + 4 or unhealthy(run.kubelet) != dropped, within=3
        )
        assert unhealthy(run.kubelet) == dropped
        assert holds_are_advertised(run.kubelet)
        assert messages_received(run.kubelet, GPU) == messages  # nothing pushed meanwhile
        await run.kubelet.restart()  # PodResources answers again; the pod is still there
        await run.settled()
        assert unhealthy(run.kubelet) == dropped
        await drained_and_released(run, "p", 16)


@asynccontextmanager
async def plugin(root: Path, config: Path) -> AsyncIterator[NodeDevicePlugin]:
    gpus = "simulated:dgx-a100-80gb"
    options = run_options(config_path=config, gpus=gpus, kubelet_dir=root, drain_recheck_s=0.05)
    async with NodeDevicePlugin(options, nvml=backend_from_spec(gpus)) as daemon:
        yield daemon


async def test_first_plan_after_a_restart_keeps_held_replicas_draining(short_dir: Path) -> None:
    """Defect 3: the config changed while the plugin was down; the first plan of the new run
    dropped the replicas running pods hold instead of draining them."""
    config = short_dir / "config.yaml"
    config.write_text(sliced(4), encoding="utf-8")
    async with KubeletSimulator(short_dir, grace_period=0.2, dial_timeout=2.0) as kubelet:
        async with plugin(short_dir, config):
            await kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 32)
            pod = await kubelet.admit_pod("p", containers={"c": {GPU: 32}})
        config.write_text(sliced(2), encoding="utf-8")
        dropped = {i for i in pod.device_ids("c", GPU) if i.endswith(("::2", "::3"))}
        async with plugin(short_dir, config) as daemon:
            await kubelet.wait_for(
                lambda: kubelet.capacity(GPU) == 32 and kubelet.allocatable(GPU) == 16,
                timeout=3,
            )
            assert holds_are_advertised(kubelet)
            assert unhealthy(kubelet) == dropped
            assert set(daemon.status.to_json()["resources"][GPU]["draining"]) == dropped
            metrics = daemon.metrics.render().decode()
            assert f'sharing_plugin_draining_devices{{resource="{GPU}"}} 16.0' in metrics
            kubelet.delete_pod("p")
            await kubelet.wait_for(lambda: kubelet.capacity(GPU) == 16, timeout=5)
            assert kubelet.allocatable(GPU) == 16


def dead_socket(path: Path) -> None:
    """A socket file nobody listens on, as a killed process leaves it."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(path))


async def test_sockets_left_by_a_killed_run_are_removed_at_start(short_dir: Path) -> None:
    """Defect 6: only ours (by name), only dead ones; kubelet's and other plugins' stay."""
    config = short_dir / "config.yaml"
    config.write_text(sliced(2), encoding="utf-8")
    async with KubeletSimulator(short_dir, grace_period=0.2, dial_timeout=2.0) as kubelet:
        plugin_dir = kubelet.plugin_dir
        stale = [
            plugin_dir / "sharing-nvidia.com-gpu-0123abcd.sock",
            plugin_dir / "sharing-nvidia.com-gpu.shared-89abcdef.sock",
            plugin_dir / "sharing-4567cdef.sock",
        ]
        for path in stale:
            dead_socket(path)
        others = [plugin_dir / "other-vendor.sock", plugin_dir / "sharing-notes-0123abcd.sock.d"]
        dead_socket(others[0])
        others[1].write_text("not a socket")
        not_a_socket = plugin_dir / "sharing-nvidia.com-gpu-aaaabbbb.sock"
        not_a_socket.write_text("a file with our name is not ours to delete")
        # A second instance still serving (a rolling update) keeps its socket.
        live_path = plugin_dir / "sharing-nvidia.com-gpu-fedcba98.sock"
        live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            live.bind(str(live_path))
            live.listen()
            async with plugin(short_dir, config) as daemon:
                await kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 16)
                assert not [p for p in stale if p.exists()]
                assert all(p.exists() for p in [*others, not_a_socket, live_path])
                assert kubelet.registration_socket.exists()
                assert all(p.exists() for p in daemon.supervisor.own_sockets())
        finally:
            live.close()
