"""ResourceServer in front of the kubelet simulator: register, advertise, Allocate, update, stop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from support.observe import numa_nodes, open_streams

from sharing_plugin.config.model import Config
from sharing_plugin.errors import KubeletError
from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.kubelet.api.deviceplugin.v1beta1 import api_pb2 as dp
from sharing_plugin.kubelet.api.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from sharing_plugin.kubelet.server import AllocateContext, ResourceServer, socket_name
from sharing_plugin.plan import Plan, ResourcePlan, physical_of
from sharing_plugin.sim.kubelet.simulator import KubeletSimulator

MakePlan = Callable[..., tuple[Plan, Config, Inventory]]
GPU = "nvidia.com/gpu"


@asynccontextmanager
async def serving(
    kubelet: KubeletSimulator, resource: ResourcePlan, context: AllocateContext
) -> AsyncIterator[ResourceServer]:
    server = ResourceServer(kubelet_dir=kubelet.kubelet_dir, resource=resource, context=context)
    await server.start()
    try:
        await server.register()
        await kubelet.wait_for(lambda: kubelet.capacity(resource.name) == len(resource.devices))
        yield server
    finally:
        await server.stop()


@asynccontextmanager
async def stub_for(server: ResourceServer) -> AsyncIterator[dp_grpc.DevicePluginAsyncStub]:
    async with grpc.aio.insecure_channel(f"unix://{server.socket_path}") as channel:
        yield dp_grpc.DevicePluginStub(channel)


CONFIGS = {
    "whole-gpus": ({}, "dgx-a100-80gb"),
    "time-slicing-renamed": (
        {
            "sharing": {
                "timeSlicing": {
                    "renameByDefault": True,
                    "resources": [{"name": GPU, "replicas": 4}],
                }
            }
        },
        "dgx-a100-80gb",
    ),
    "mig-mixed": ({"flags": {"migStrategy": "mixed"}}, "a100-mig-mixed"),
    "mps": ({"sharing": {"mps": {"resources": [{"name": GPU, "replicas": 2}]}}}, "dgx-a100-80gb"),
}


@pytest.mark.parametrize("config_name", sorted(CONFIGS))
async def test_every_resource_registers_and_kubelet_sees_its_devices(
    kubelet_sim: KubeletSimulator, make_plan: MakePlan, config_name: str
) -> None:
    config, preset = CONFIGS[config_name]
    the_plan, cfg, inventory = make_plan(config, preset)
    context = AllocateContext(flags=cfg.flags, inventory=inventory)
    servers = [
        ResourceServer(kubelet_dir=kubelet_sim.kubelet_dir, resource=r, context=context)
        for r in the_plan.resources
    ]
    try:
        for server in servers:
            await server.start()
            await server.register()
            assert server.registered
        expected = {r.name: r for r in the_plan.resources}
        await kubelet_sim.wait_for(
            lambda: all(kubelet_sim.capacity(n) == len(r.devices) for n, r in expected.items())
        )
        for name, resource in expected.items():
            assert list(kubelet_sim.devices(name)) == list(resource.ids)
            numa = numa_nodes(kubelet_sim, name)
            assert all(
                numa[d.id] == ((d.numa,) if d.numa is not None else ()) for d in resource.devices
            )
            options = kubelet_sim.options(name)
            assert options is not None and options.get_preferred_allocation_available
            assert not options.pre_start_required
        endpoints = [r.endpoint for r in kubelet_sim.registrations]
        assert len(set(endpoints)) == len(servers)
        assert all(e.startswith("sharing-") and e.endswith(".sock") for e in endpoints)
    finally:
        for server in servers:
            await server.stop()
    await kubelet_sim.wait_for(lambda: all(kubelet_sim.capacity(n) == 0 for n in expected))
    assert not list(kubelet_sim.plugin_dir.glob("sharing-*"))


def test_socket_names_keep_only_safe_characters() -> None:
    name = socket_name("Example.COM/../gpu shared$(rm)")
    assert name.startswith("sharing-example.com-..-gpu-shared-rm-") and name.endswith(".sock")
    assert "/" not in name and " " not in name
    assert socket_name(GPU) != socket_name(GPU)  # unique per start
    assert len(socket_name("x" * 300, max_length=40)) <= 40


# -- Allocate through the simulator's pod admission ------------------------------------------

STRATEGIES: dict[str, dict[str, Any]] = {
    "envvar": {},
    "volume-mounts": {"deviceListStrategy": "volume-mounts"},
    "cdi-annotations": {"deviceListStrategy": "cdi-annotations"},
    "cdi-cri": {"deviceListStrategy": "cdi-cri"},
    "index": {"deviceIDStrategy": "index"},
    "pass-device-specs": {"passDeviceSpecs": True},
}


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
async def test_allocate_answers_for_each_strategy(
    kubelet_sim: KubeletSimulator, make_plan: MakePlan, strategy: str
) -> None:
    the_plan, cfg, inventory = make_plan({"flags": {"plugin": STRATEGIES[strategy]}})
    resource = the_plan.resource(GPU)
    assert resource is not None
    context = AllocateContext(
        flags=cfg.flags, inventory=inventory, control_nodes=("/dev/nvidiactl",)
    )
    async with serving(kubelet_sim, resource, context):
        pod = await kubelet_sim.admit_pod("p", containers={"c": {GPU: 1}})
        [device_id] = pod.device_ids("c", GPU)
        device = resource.device(device_id)
        assert device is not None
        answer = pod.get("c", GPU).response
        envs, mounts = dict(answer.envs), [(m.container_path, m.host_path) for m in answer.mounts]
        cdi = [d.name for d in answer.cdi_devices]
        nodes = [d.container_path for d in answer.devices]
        if strategy == "envvar":
            assert envs == {"NVIDIA_VISIBLE_DEVICES": device_id}
            assert (mounts, cdi, nodes, dict(answer.annotations)) == ([], [], [], {})
        elif strategy == "volume-mounts":
            assert envs == {"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"}
            assert mounts == [(f"/var/run/nvidia-container-devices/{device_id}", "/dev/null")]
        elif strategy == "cdi-annotations":
            [(key, value)] = answer.annotations.items()
            assert key.startswith("cdi.k8s.io/nvidia-device-plugin_")
            assert value == f"nvidia.com/gpu={device_id}"
            assert envs == {} and cdi == []
        elif strategy == "cdi-cri":
            assert cdi == [f"nvidia.com/gpu={device_id}"]
            assert envs == {} and dict(answer.annotations) == {}
        elif strategy == "index":
            assert envs == {"NVIDIA_VISIBLE_DEVICES": device.index}
        else:
            assert envs == {"NVIDIA_VISIBLE_DEVICES": device_id}
            assert nodes == ["/dev/nvidiactl", *device.paths]
            assert all(d.permissions == "rw" for d in answer.devices)


async def test_preferred_allocation_spreads_two_replicas_over_two_gpus(
    kubelet_sim: KubeletSimulator, make_plan: MakePlan
) -> None:
    config = {"sharing": {"timeSlicing": {"resources": [{"name": GPU, "replicas": 4}]}}}
    the_plan, cfg, inventory = make_plan(config)
    resource = the_plan.resource(GPU)
    assert resource is not None and len(resource.devices) == 32
    async with serving(kubelet_sim, resource, AllocateContext(cfg.flags, inventory)):
        pod = await kubelet_sim.admit_pod("p", containers={"c": {GPU: 2}})
        ids = pod.device_ids("c", GPU)
        # Without a preference kubelet would take the first two free IDs: replicas 0 and 1 of
        # the same GPU.
        assert len({physical_of(i) for i in ids}) == 2
        visible = pod.get("c", GPU).response.envs["NVIDIA_VISIBLE_DEVICES"].split(",")
        assert visible == [physical_of(i) for i in ids]


async def test_invalid_requests_are_refused_and_the_server_keeps_serving(
    kubelet_sim: KubeletSimulator, make_plan: MakePlan
) -> None:
    config = {"sharing": {"mps": {"resources": [{"name": GPU, "replicas": 2}]}}}
    the_plan, cfg, inventory = make_plan(config)
    resource = the_plan.resource(GPU)
    assert resource is not None and resource.fail_requests_greater_than_one
    async with (
        serving(kubelet_sim, resource, AllocateContext(cfg.flags, inventory)) as server,
        stub_for(server) as stub,
    ):

        def request(*ids: str) -> dp.AllocateRequest:
            return dp.AllocateRequest(
                container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)]
            )

        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await stub.Allocate(request("GPU-nope::0"), timeout=5)
        assert unknown.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "unknown device: GPU-nope::0" in (unknown.value.details() or "")

        two = resource.ids[:2]
        with pytest.raises(grpc.aio.AioRpcError) as too_many:
            await stub.Allocate(request(*two), timeout=5)
        assert too_many.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "maximum request size for shared resources is 1" in (too_many.value.details() or "")

        # Garbage in GetPreferredAllocation gets a best-effort answer, never an error.
        preferred = await stub.GetPreferredAllocation(
            dp.PreferredAllocationRequest(
                container_requests=[
                    dp.ContainerPreferredAllocationRequest(
                        available_deviceIDs=["x", resource.ids[0]],
                        must_include_deviceIDs=["y"],
                        allocation_size=-3,
                    )
                ]
            ),
            timeout=5,
        )
        assert len(preferred.container_responses) == 1
        assert await stub.PreStartContainer(dp.PreStartContainerRequest(), timeout=5) == (
            dp.PreStartContainerResponse()
        )

        answer = await stub.Allocate(request(resource.ids[0]), timeout=5)
        assert (
            answer.container_responses[0].envs["CUDA_MPS_PIPE_DIRECTORY"]
            == "/mps/nvidia.com/gpu/pipe"
        )
        pod = await kubelet_sim.admit_pod("p", containers={"c": {GPU: 1}})
        assert len(pod.device_ids("c", GPU)) == 1


# -- ListAndWatch updates and stop -------------------------------------------------------------


async def test_update_pushes_one_message_only_when_kubelets_view_changes(
    kubelet_sim: KubeletSimulator, make_plan: MakePlan
) -> None:
    the_plan, cfg, inventory = make_plan({})
    resource = the_plan.resource(GPU)
    assert resource is not None
    sick = inventory.gpus[0].uuid
    async with (
        serving(kubelet_sim, resource, AllocateContext(cfg.flags, inventory)) as server,
        stub_for(server) as stub,
    ):
        stream = stub.ListAndWatch(dp.Empty())
        first = await stream.read()
        assert [d.ID for d in first.devices] == list(resource.ids)

        unhealthy = resource.with_health(frozenset({sick}))
        assert server.update(unhealthy)
        second = await stream.read()
        assert {d.ID: d.health for d in second.devices}[sick] == "Unhealthy"
        await kubelet_sim.wait_for(lambda: kubelet_sim.allocatable(GPU) == 7)
        assert kubelet_sim.capacity(GPU) == 8

        # Same devices, new flags: Allocate changes, kubelet hears nothing.
        index_flags = cfg.flags.model_copy(
            update={"plugin": cfg.flags.plugin.model_copy(update={"device_id_strategy": "index"})}
        )
        assert not server.update(unhealthy, AllocateContext(index_flags, inventory))
        assert server.context.flags is index_flags

        assert server.update(resource)  # healthy again
        third = await stream.read()  # the unchanged update sent nothing in between
        assert all(d.health == "Healthy" for d in third.devices)
        await kubelet_sim.wait_for(lambda: kubelet_sim.allocatable(GPU) == 8)

        # A stream held by us ends when the server stops, right after an empty list.
        await server.stop()
        last = await stream.read()
        assert list(last.devices) == []
        assert await stream.read() is grpc.aio.EOF


async def test_stop_removes_the_socket_and_kubelet_sees_zero_devices(
    kubelet_sim: KubeletSimulator, make_plan: MakePlan
) -> None:
    the_plan, cfg, inventory = make_plan({})
    resource = the_plan.resource(GPU)
    assert resource is not None
    async with serving(kubelet_sim, resource, AllocateContext(cfg.flags, inventory)) as server:
        socket = server.socket_path
        assert socket is not None and socket.exists()
        assert open_streams(server) == 1  # kubelet's
        started = asyncio.get_running_loop().time()
        await server.stop()
        assert asyncio.get_running_loop().time() - started < 0.6
        assert not socket.exists()
        assert server.socket_path is None and not server.registered
        await kubelet_sim.wait_for(lambda: kubelet_sim.capacity(GPU) == 0)
        await server.stop()  # idempotent


async def test_register_without_kubelet_says_what_to_check(
    short_dir: Path, make_plan: MakePlan
) -> None:
    the_plan, cfg, _ = make_plan({})
    resource = the_plan.resources[0]
    server = ResourceServer(
        kubelet_dir=short_dir, resource=resource, context=AllocateContext(cfg.flags)
    )
    try:
        with pytest.raises(KubeletError, match=r"registration socket .* does not exist"):
            await server.register()
        assert not server.registered
        assert server.socket_path is not None and server.socket_path.exists()
    finally:
        await server.stop()


async def test_metrics_count_registrations_and_allocations(
    kubelet_sim: KubeletSimulator, make_plan: MakePlan
) -> None:
    from sharing_plugin.observability.metrics import Metrics

    metrics = Metrics()
    the_plan, cfg, inventory = make_plan({})
    resource = the_plan.resource(GPU)
    assert resource is not None
    server = ResourceServer(
        kubelet_dir=kubelet_sim.kubelet_dir,
        resource=resource,
        context=AllocateContext(cfg.flags, inventory),
        metrics=metrics,
    )
    await server.start()
    try:
        await server.register()
        await kubelet_sim.wait_for(lambda: kubelet_sim.allocatable(GPU) == 8)
        await kubelet_sim.admit_pod("p", containers={"c": {GPU: 1}})
        server.update(resource.with_health(frozenset({inventory.gpus[0].uuid})))
        text = metrics.render().decode()
        assert (
            'sharing_plugin_registrations_total{resource="nvidia.com/gpu",result="ok"} 1.0' in text
        )
        assert 'sharing_plugin_allocations_total{resource="nvidia.com/gpu",result="ok"} 1.0' in text
        # Device gauges have one writer, the supervisor, which knows what is draining.
        assert 'sharing_plugin_healthy_devices{resource="nvidia.com/gpu"}' not in text
        assert 'sharing_plugin_resource_registered{resource="nvidia.com/gpu"} 1.0' in text
    finally:
        await server.stop()
    assert 'sharing_plugin_resource_registered{resource="nvidia.com/gpu"} 0.0' in (
        metrics.render().decode()
    )


async def test_allocate_during_a_storm_of_updates_answers_from_one_plan(
    kubelet_sim: KubeletSimulator, make_plan: MakePlan
) -> None:
    the_plan, cfg, inventory = make_plan({})
    resource = the_plan.resource(GPU)
    assert resource is not None
    by_uuid = AllocateContext(cfg.flags, inventory)
    index_plugin = cfg.flags.plugin.model_copy(update={"device_id_strategy": "index"})
    by_index = AllocateContext(cfg.flags.model_copy(update={"plugin": index_plugin}), inventory)
    device = resource.devices[3]
    async with serving(kubelet_sim, resource, by_uuid) as server, stub_for(server) as stub:
        request = dp.AllocateRequest(
            container_requests=[dp.ContainerAllocateRequest(devices_ids=[device.id])] * 2
        )
        calls = [asyncio.ensure_future(stub.Allocate(request, timeout=5)) for _ in range(60)]
        for i in range(60):
            server.update(resource, by_index if i % 2 else by_uuid)
            await asyncio.sleep(0)
        answers = await asyncio.gather(*calls)
    seen = set()
    for answer in answers:
        values = {r.envs["NVIDIA_VISIBLE_DEVICES"] for r in answer.container_responses}
        assert len(values) == 1  # both containers answered from the same snapshot
        seen |= values
    assert seen <= {device.id, device.index}
