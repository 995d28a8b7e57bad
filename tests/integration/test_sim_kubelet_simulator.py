"""The kubelet simulator behaves like kubelet's device manager, over real unix sockets."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from fake_device_plugin import FakeDevicePlugin, devices
from support.observe import drop_before_stream, numa_nodes

from sharing_plugin.sim.kubelet.endpoint import is_extended_resource_name
from sharing_plugin.sim.kubelet.simulator import KubeletSimulator

GPU = "example.com/gpu"


@pytest.fixture
async def kubelet(short_dir: Path) -> AsyncIterator[KubeletSimulator]:
    async with KubeletSimulator(short_dir, grace_period=0.2, dial_timeout=0.5) as sim:
        yield sim


async def test_registration_dials_back_and_each_list_replaces_the_devices(
    kubelet: KubeletSimulator,
) -> None:
    initial = devices(["a", "b", "c", "d"], numa=1)
    async with FakeDevicePlugin(
        kubelet.plugin_dir, initial=initial, preferred=lambda r: []
    ) as plugin:
        await plugin.register()
        await kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 4, timeout=2)
        assert plugin.names()[:2] == ["GetDevicePluginOptions", "ListAndWatch"]
        [registration] = kubelet.registrations
        assert (registration.resource, registration.endpoint) == (GPU, "fake.sock")
        # The RegisterRequest said nothing; the options come from GetDevicePluginOptions.
        assert registration.options.get_preferred_allocation_available
        assert numa_nodes(kubelet, GPU)["a"] == (1,)

        # Health is "Healthy" by exact match: any other spelling counts as unhealthy.
        plugin.push(devices(["a"]) + devices(["e"], health="healthy"))
        await kubelet.wait_for(lambda: kubelet.capacity(GPU) == 2, timeout=2)
        assert kubelet.devices(GPU) == {"a": "Healthy", "e": "healthy"}
        assert kubelet.allocatable(GPU) == 1


async def test_an_unsupported_version_is_refused_with_kubelets_message(
    kubelet: KubeletSimulator,
) -> None:
    async with FakeDevicePlugin(kubelet.plugin_dir, initial=devices(["a"])) as plugin:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await plugin.register(version="v1alpha")
    assert refused.value.code() == grpc.StatusCode.UNKNOWN
    assert refused.value.details() == (
        'requested API version "v1alpha" is not supported by kubelet. '
        'Supported version is ["v1beta1"]'
    )
    assert kubelet.registrations == []
    assert plugin.calls == []


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("nvidia.com/gpu", True),
        ("nvidia.com/gpu.shared", True),
        ("nvidia.com/mig-1g.10gb", True),
        ("gpu", False),
        ("kubernetes.io/gpu", False),
        ("requests.example.com/gpu", False),
        ("example.com/", False),
        ("Example.com/gpu", False),
        ("example.com/a/b", False),
        ("example.com/-gpu", False),
        ("example.com/" + "g" * 64, False),
    ],
)
def test_extended_resource_names_follow_kubelets_rule(name: str, valid: bool) -> None:
    assert is_extended_resource_name(name) is valid


async def test_an_invalid_resource_name_is_refused(kubelet: KubeletSimulator) -> None:
    async with FakeDevicePlugin(kubelet.plugin_dir, initial=devices(["a"])) as plugin:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await plugin.register(resource="gpu")
    assert refused.value.details() == 'the ResourceName "gpu" is invalid'
    assert kubelet.resources() == []


async def test_registration_fails_when_nothing_answers_on_the_endpoint(
    kubelet: KubeletSimulator,
) -> None:
    plugin = FakeDevicePlugin(kubelet.plugin_dir)  # never started
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await plugin.register()
    assert (refused.value.details() or "").startswith("failed to dial device plugin")
    assert kubelet.registrations == []


async def test_stream_end_marks_everything_unhealthy_then_capacity_drops_to_zero(
    kubelet: KubeletSimulator,
) -> None:
    async with FakeDevicePlugin(kubelet.plugin_dir, initial=devices(["a", "b"])) as plugin:
        await plugin.register()
        await kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 2, timeout=2)
        plugin.end_stream()
        await kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 0, timeout=2)
        assert kubelet.devices(GPU) == {"a": "Unhealthy", "b": "Unhealthy"}
        assert kubelet.capacity(GPU) == 2
        # After the grace period kubelet forgets the devices; it never reopens the stream.
        await kubelet.wait_for(lambda: kubelet.capacity(GPU) == 0, timeout=2)
        assert plugin.names().count("ListAndWatch") == 1
        assert any("ListAndWatch ended unexpectedly" in e for e in kubelet.events)


async def test_a_new_registration_replaces_the_old_endpoint(kubelet: KubeletSimulator) -> None:
    async with (
        FakeDevicePlugin(kubelet.plugin_dir, initial=devices(["a"])) as old,
        FakeDevicePlugin(
            kubelet.plugin_dir, endpoint="new.sock", initial=devices(["x", "y"])
        ) as new,
    ):
        await old.register()
        await kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 1, timeout=2)
        await new.register()
        await kubelet.wait_for(lambda: set(kubelet.devices(GPU)) == {"x", "y"}, timeout=2)
        assert [r.endpoint for r in kubelet.registrations] == ["fake.sock", "new.sock"]
        old.push(devices(["a", "b", "c"]))  # the replaced endpoint no longer counts
        new.push(devices(["z"]))
        await kubelet.wait_for(lambda: kubelet.devices(GPU) == {"z": "Healthy"}, timeout=2)
        assert kubelet.options(GPU) is not None


async def test_a_registration_dropped_before_its_stream_opens_leaves_the_devices_unhealthy(
    short_dir: Path,
) -> None:
    # A grace period no busy machine outlasts between the drop and the look at the devices.
    async with (
        KubeletSimulator(short_dir, grace_period=60, dial_timeout=0.5) as kubelet,
        FakeDevicePlugin(kubelet.plugin_dir, initial=devices(["a", "b"])) as plugin,
    ):
        await plugin.register()
        await kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 2, timeout=2)
        drop_before_stream(kubelet, GPU)
        await plugin.register()  # answered OK: the dial-back and the options went through
        await kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 0, timeout=2)
        assert kubelet.devices(GPU) == {"a": "Unhealthy", "b": "Unhealthy"}
        assert plugin.names().count("GetDevicePluginOptions") == 2
        assert plugin.names().count("ListAndWatch") == 1
        assert kubelet.options(GPU) is None
        # Only the next registration was dropped: the one after serves again.
        plugin.push(devices(["a", "b"]))
        await plugin.register()
        await kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 2, timeout=2)


async def test_a_list_over_kubelets_4_mib_limit_ends_the_stream(
    kubelet: KubeletSimulator,
) -> None:
    async with FakeDevicePlugin(kubelet.plugin_dir, initial=devices(["a"])) as plugin:
        await plugin.register()
        await kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 1, timeout=2)
        huge = devices([f"GPU-{n:058d}" for n in range(70_000)])  # ~5 MiB serialized
        plugin.push(huge)
        await kubelet.wait_for(lambda: kubelet.devices(GPU) == {"a": "Unhealthy"}, timeout=5)
        assert any("RESOURCE_EXHAUSTED" in e for e in kubelet.events)


async def test_wait_for_times_out_with_the_state_in_the_message(
    kubelet: KubeletSimulator,
) -> None:
    with pytest.raises(TimeoutError, match=r"condition not met within 0\.05 s"):
        await kubelet.wait_for(lambda: kubelet.capacity(GPU) == 1, timeout=0.05)


async def test_restart_wipes_sockets_but_not_the_checkpoint_and_accepts_new_registrations(
    kubelet: KubeletSimulator,
) -> None:
    (kubelet.plugin_dir / "keep-me").mkdir()
    async with FakeDevicePlugin(kubelet.plugin_dir, initial=devices(["a", "b"])) as plugin:
        await plugin.register()
        await kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 2, timeout=2)
        pod = await kubelet.admit_pod("p", containers={"c": {GPU: 1}})
        await kubelet.restart()
        left = sorted(p.name for p in kubelet.plugin_dir.iterdir())
        assert left == ["keep-me", "kubelet.sock", "kubelet_internal_checkpoint"]
        assert kubelet.registrations == []
        assert kubelet.capacity(GPU) == 0
        assert kubelet.pods[("default", "p")] == pod
    async with FakeDevicePlugin(
        kubelet.plugin_dir, endpoint="again.sock", initial=devices(["a", "b"])
    ) as again:
        await again.register()
        await kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 2, timeout=2)
        assert [r.endpoint for r in kubelet.registrations] == ["again.sock"]
