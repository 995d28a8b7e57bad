"""Pod admission and the PodResources service of the kubelet simulator, over real sockets."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from fake_device_plugin import FakeDevicePlugin, devices, reversed_preference

from sharing_plugin.kubelet.api.deviceplugin.v1beta1 import api_pb2 as dp
from sharing_plugin.kubelet.api.podresources.v1 import api_pb2 as pr
from sharing_plugin.kubelet.api.podresources.v1 import api_pb2_grpc as pr_grpc
from sharing_plugin.sim.kubelet.simulator import AdmissionError, KubeletSimulator

GPU = "example.com/gpu"
NIC = "example.com/nic"


@pytest.fixture
async def kubelet(short_dir: Path) -> AsyncIterator[KubeletSimulator]:
    async with KubeletSimulator(short_dir, grace_period=0.2, dial_timeout=0.5) as sim:
        yield sim


async def test_admission_asks_for_a_preference_then_allocates_per_container_and_resource(
    kubelet: KubeletSimulator,
) -> None:
    def preference(request: dp.ContainerPreferredAllocationRequest) -> list[str]:
        # Unknown and duplicate IDs are ignored; a short answer is filled from the free list.
        return ["nope", "d", "d"]

    async with (
        FakeDevicePlugin(
            kubelet.plugin_dir, initial=devices(["a", "b", "c", "d"]), preferred=preference
        ) as gpus,
        FakeDevicePlugin(
            kubelet.plugin_dir, resource=NIC, endpoint="nic.sock", initial=devices(["n0", "n1"])
        ) as nics,
    ):
        await gpus.register()
        await nics.register()
        await kubelet.wait_for(lambda: kubelet.allocatable(NIC) == 2, timeout=2)
        await kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 4, timeout=2)
        pod = await kubelet.admit_pod(
            "train", containers={"main": {GPU: 2, NIC: 1}, "side": {GPU: 1}}
        )
        # Node allocatable counts healthy devices, held or not. Asked while the plugin still
        # runs: once it stops, its stream's end marks every device Unhealthy.
        assert kubelet.allocatable(GPU) == 4

    assert pod.containers == {"main": {GPU: ("d", "a"), NIC: ("n0",)}, "side": {GPU: ("b",)}}
    # One GetPreferredAllocation per container and resource, with every free healthy device.
    asked = [r for name, r in gpus.calls if name == "GetPreferredAllocation"]
    assert [list(r.container_requests[0].available_deviceIDs) for r in asked] == [
        ["a", "b", "c", "d"],
        ["b", "c"],
    ]
    assert [r.container_requests[0].allocation_size for r in asked] == [2, 1]
    assert all(not r.container_requests[0].must_include_deviceIDs for r in asked)
    # One Allocate per container per resource; the plugin without preference is never asked.
    assert gpus.names().count("Allocate") == 2
    assert nics.names() == ["GetDevicePluginOptions", "ListAndWatch", "Allocate"]
    assert pod.get("main", GPU).response.envs["VISIBLE"] == "d,a"


async def test_a_preference_is_followed_when_it_is_valid(kubelet: KubeletSimulator) -> None:
    async with FakeDevicePlugin(
        kubelet.plugin_dir, initial=devices(["a", "b", "c"]), preferred=reversed_preference
    ) as plugin:
        await plugin.register()
        await kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 3, timeout=2)
        pod = await kubelet.admit_pod("p", "ns", containers={"c": {GPU: 2}})
    assert pod.device_ids("c", GPU) == ("c", "b")
    assert (pod.namespace, pod.name) == ("ns", "p")


async def test_too_few_free_devices_refuses_the_pod_and_records_nothing(
    kubelet: KubeletSimulator,
) -> None:
    async with FakeDevicePlugin(
        kubelet.plugin_dir, initial=devices(["a", "b"]) + devices(["c"], health="Unhealthy")
    ) as plugin:
        await plugin.register()
        await kubelet.wait_for(lambda: kubelet.capacity(GPU) == 3, timeout=2)
        await kubelet.admit_pod("first", containers={"c": {GPU: 1}})
        with pytest.raises(AdmissionError) as refused:
            await kubelet.admit_pod("second", containers={"c": {GPU: 2}})
        assert str(refused.value) == (
            "pod default/second, container 'c': requested number of devices unavailable for "
            "example.com/gpu. Requested: 2, Available: 1"
        )
        assert list(kubelet.pods) == [("default", "first")]
        kubelet.delete_pod("first")
        second = await kubelet.admit_pod("second", containers={"c": {GPU: 2}})
        assert second.device_ids("c", GPU) == ("a", "b")
        with pytest.raises(AdmissionError, match=r"cannot allocate unregistered device x\.io/y"):
            await kubelet.admit_pod("third", containers={"c": {"x.io/y": 1}})
        with pytest.raises(AdmissionError, match="already admitted"):
            await kubelet.admit_pod("second", containers={})


async def test_a_refused_allocate_refuses_the_pod_with_the_plugins_message(
    kubelet: KubeletSimulator,
) -> None:
    async with FakeDevicePlugin(
        kubelet.plugin_dir, initial=devices(["bad"]), pre_start_required=True
    ) as plugin:
        await plugin.register()
        await kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 1, timeout=2)
        with pytest.raises(AdmissionError) as refused:
            await kubelet.admit_pod("p", containers={"c": {GPU: 1}})
        assert "Allocate failed due to rpc error: code = InvalidArgument" in str(refused.value)
        assert "unknown device 'bad'" in str(refused.value)
        assert kubelet.pods == {}
        plugin.push(devices(["good"]))
        await kubelet.wait_for(lambda: "good" in kubelet.devices(GPU), timeout=2)
        await kubelet.admit_pod("p", containers={"c": {GPU: 1}})
        assert plugin.names()[-2:] == ["Allocate", "PreStartContainer"]


async def test_pod_resources_reflect_admitted_pods_and_known_devices(
    kubelet: KubeletSimulator,
) -> None:
    async with FakeDevicePlugin(
        kubelet.plugin_dir, initial=devices(["a", "b"], numa=0) + devices(["c"])
    ) as plugin:
        await plugin.register()
        await kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 3, timeout=2)
        await kubelet.admit_pod("p", "ns", containers={"main": {GPU: 2}, "idle": {}})

        async with grpc.aio.insecure_channel(f"unix://{kubelet.pod_resources_socket}") as ch:
            lister = pr_grpc.PodResourcesListerStub(ch)
            listed = await lister.List(pr.ListPodResourcesRequest())
            got = await lister.Get(pr.GetPodResourcesRequest(pod_name="p", pod_namespace="ns"))
            allocatable = await lister.GetAllocatableResources(pr.AllocatableResourcesRequest())
            with pytest.raises(grpc.aio.AioRpcError) as missing:
                await lister.Get(pr.GetPodResourcesRequest(pod_name="q", pod_namespace="ns"))
            kubelet.delete_pod("p", "ns")
            after = await lister.List(pr.ListPodResourcesRequest())

    [pod] = listed.pod_resources
    assert (pod.name, pod.namespace) == ("p", "ns")
    [main, idle] = pod.containers
    assert (main.name, idle.name, list(idle.devices)) == ("main", "idle", [])
    # Like kubelet: one entry per device (and NUMA node), not one per resource.
    assert [
        (d.resource_name, list(d.device_ids), [n.ID for n in d.topology.nodes])
        for d in main.devices
    ] == [
        (GPU, ["a"], [0]),
        (GPU, ["b"], [0]),
    ]
    assert got.pod_resources == pod
    assert sorted(d.device_ids[0] for d in allocatable.devices) == ["a", "b", "c"]
    assert missing.value.details() == "pod q in namespace ns not found"
    assert list(after.pod_resources) == []
