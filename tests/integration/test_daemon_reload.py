"""Hot reload through the real daemon: every transition of issue 6, seen from kubelet's side."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
from daemon_harness import Running, running
from support.configs import sliced
from support.observe import messages_received, next_applied, next_rejected, open_streams, servers

from sharing_plugin.sim.kubelet.simulator import AdmissionError

GPU = "nvidia.com/gpu"
SHARED = "nvidia.com/gpu.shared"


def _registrations(run: Running, resource: str) -> int:
    return sum(1 for r in run.kubelet.registrations if r.resource == resource)


async def _wait_capacity(run: Running, expected: dict[str, int]) -> None:
    await run.kubelet.wait_for(
        lambda: {k: v for k, v in run.capacity().items() if v} == expected, timeout=5
    )
    await run.settled()


async def test_replicas_up_and_down_keep_surviving_ids_without_reregistering(
    short_dir: Path,
) -> None:
    async with running(short_dir, sliced(2)) as run:
        before = set(run.kubelet.devices(GPU))
        run.write(sliced(4))
        await _wait_capacity(run, {GPU: 32})
        assert before <= set(run.kubelet.devices(GPU))
        run.write(sliced(3))
        await _wait_capacity(run, {GPU: 24})
        assert before <= set(run.kubelet.devices(GPU))
        assert _registrations(run, GPU) == 1
        assert run.daemon.status.to_json()["config"]["generation"] == 3


async def test_rename_starts_the_new_resource_and_removes_the_old(short_dir: Path) -> None:
    async with running(short_dir, sliced(2)) as run:
        old_sockets = set(run.daemon.supervisor.own_sockets())
        run.write(sliced(2, rename=True))
        await _wait_capacity(run, {SHARED: 16})
        assert run.kubelet.capacity(GPU) == 0
        assert not any(p.exists() for p in old_sockets)
        assert _registrations(run, SHARED) == 1


async def test_sharing_turned_off_pushes_whole_gpus_on_the_same_stream(short_dir: Path) -> None:
    async with running(short_dir, sliced(2)) as run:
        run.write("version: v1\n")
        await _wait_capacity(run, {GPU: 8})
        assert all("::" not in i for i in run.kubelet.devices(GPU))
        assert _registrations(run, GPU) == 1


async def test_unchanged_resource_gets_no_message(short_dir: Path) -> None:
    async with running(short_dir, sliced(2)) as run:
        messages = messages_received(run.kubelet, GPU)
        with run.daemon.pipeline.outcomes() as outcomes:
            run.write(sliced(2) + "# only a comment changed\n")
            await next_applied(outcomes)
            run.daemon.request_reload()
            await next_applied(outcomes)
        # A real change now: its list arrives after anything the reloads above sent (one stream,
        # in order), so exactly one more message means they sent none.
        run.write(sliced(3))
        await _wait_capacity(run, {GPU: 8 * 3})
        assert messages_received(run.kubelet, GPU) == messages + 1


async def test_mig_strategy_change_moves_devices_between_resources(short_dir: Path) -> None:
    async with running(short_dir, "version: v1\n", gpus="simulated:a100-mig-mixed") as run:
        assert run.capacity() == {GPU: 6}
        run.write("version: v1\nflags:\n  migStrategy: mixed\n")
        await run.kubelet.wait_for(lambda: "nvidia.com/mig-3g.40gb" in run.capacity(), timeout=5)
        await run.settled()
        capacity = {k: v for k, v in run.capacity().items() if v}
        assert capacity[GPU] == 1  # the A100-40GB with MIG off stays a whole GPU
        assert capacity["nvidia.com/mig-1g.10gb"] == 9
        assert capacity["nvidia.com/mig-3g.40gb"] == 2


async def test_held_replicas_drain_then_vanish_when_released(short_dir: Path) -> None:
    async with running(short_dir, sliced(4)) as run:
        pod = await run.kubelet.admit_pod("holder", containers={"c": {GPU: 32}})
        held = set(pod.device_ids("c", GPU))
        dropped = {i for i in held if i.endswith(("::2", "::3"))}
        assert len(dropped) == 16
        run.write(sliced(2))
        await run.kubelet.wait_for(
            lambda: run.kubelet.capacity(GPU) == 32 and run.kubelet.allocatable(GPU) == 16,
            timeout=5,
        )
        assert {i for i, h in run.kubelet.devices(GPU).items() if h == "Unhealthy"} == dropped
        status = run.daemon.status.to_json()["resources"][GPU]
        assert set(status["draining"]) == dropped
        run.kubelet.delete_pod("holder")
        await run.kubelet.wait_for(lambda: run.kubelet.capacity(GPU) == 16, timeout=5)
        await run.settled()
        assert run.allocatable() == {GPU: 16}
        assert run.daemon.status.to_json()["resources"][GPU]["draining"] == []


async def test_broken_edit_keeps_the_last_good_config_until_fixed(short_dir: Path) -> None:
    async with running(short_dir, sliced(2)) as run:
        with run.daemon.pipeline.outcomes() as outcomes:
            run.write(sliced(4, rename=False).replace("replicas: 4", "replicas: 0"))
            await next_rejected(outcomes)
        error = run.daemon.status.last_error
        assert error is not None and "config.yaml:7:19" in error and "replicas" in error
        assert run.capacity() == {GPU: 16}
        metrics = run.daemon.metrics.render().decode()
        assert 'sharing_plugin_reloads_total{result="failed"} 1.0' in metrics
        run.write(sliced(4))
        await _wait_capacity(run, {GPU: 32})
        assert run.daemon.status.last_error is None


async def test_burst_of_twenty_edits_ends_in_the_last_one(short_dir: Path) -> None:
    async with running(short_dir, sliced(2)) as run:
        for replicas in range(3, 23):
            run.write(sliced(replicas))
            await asyncio.sleep(0.002)
        await _wait_capacity(run, {GPU: 8 * 22})
        assert _registrations(run, GPU) == 1
        assert open_streams(servers(run.daemon.supervisor)[GPU]) == 1


async def test_deleted_file_keeps_serving_and_reports(short_dir: Path) -> None:
    async with running(short_dir, sliced(2)) as run:
        with run.daemon.pipeline.outcomes() as outcomes:
            run.config.unlink()
            await next_rejected(outcomes)
        error = run.daemon.status.last_error
        assert error is not None and "config.yaml" in error
        assert run.capacity() == {GPU: 16}
        run.write(sliced(3))
        await _wait_capacity(run, {GPU: 24})


async def test_allocate_during_a_reload_storm_sees_one_consistent_plan(short_dir: Path) -> None:
    async with running(short_dir, sliced(2)) as run:
        server = servers(run.daemon.supervisor)[GPU]
        assert server.socket_path is not None
        from sharing_plugin.kubelet.api.deviceplugin.v1beta1 import api_pb2 as dp
        from sharing_plugin.kubelet.api.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc

        async with grpc.aio.insecure_channel(f"unix://{server.socket_path}") as channel:
            stub = dp_grpc.DevicePluginStub(channel)
            stop = asyncio.Event()
            outcomes: list[str] = []

            async def allocate_forever() -> None:
                while not stop.is_set():
                    ids = list(run.kubelet.devices(GPU))[:2]
                    request = dp.AllocateRequest(
                        container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)]
                    )
                    try:
                        response = await stub.Allocate(request, timeout=2)
                    except grpc.aio.AioRpcError as exc:
                        assert exc.code() is grpc.StatusCode.INVALID_ARGUMENT, exc
                        outcomes.append("refused")
                    else:
                        env = response.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"]
                        assert env and all(p.startswith("GPU-") for p in env.split(","))
                        outcomes.append("ok")

            workers = [asyncio.create_task(allocate_forever()) for _ in range(4)]
            for replicas in [3, 4, 2, 5, 1, 2] * 3:
                run.write(sliced(replicas))
                await asyncio.sleep(0.01)
            await _wait_capacity(run, {GPU: 16})
            stop.set()
            await asyncio.gather(*workers)
        assert "ok" in outcomes
        assert set(outcomes) <= {"ok", "refused"}


async def test_admission_after_shrink_never_uses_a_removed_replica(short_dir: Path) -> None:
    async with running(short_dir, sliced(4)) as run:
        run.write(sliced(1))
        await _wait_capacity(run, {GPU: 8})
        pod = await run.kubelet.admit_pod("p", containers={"c": {GPU: 8}})
        assert all("::0" in i for i in pod.device_ids("c", GPU))
        try:
            await run.kubelet.admit_pod("q", containers={"c": {GPU: 1}})
        except AdmissionError:
            pass
        else:
            raise AssertionError("a ninth replica was admitted on a node with eight")
