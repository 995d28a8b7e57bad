"""The node's pool through the API (the fake kube-apiserver's resource.k8s.io): discovery,
ResourceSlices written, replaced and deleted with the pool generation, claims read in both
versions, and what the fake itself enforces of the API's rules."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import lightkube
import pytest
from dra_support import published_devices
from kube_api import FakeKubeApi, permissions

from sharing_plugin.dra.claims import ApiClaimReader, ClaimRef
from sharing_plugin.dra.resources import discover_version
from sharing_plugin.dra.slices import SlicePublisher
from sharing_plugin.errors import KubeApiError
from sharing_plugin.views.dra_api import V1, V1BETA1

DRIVER = "gpu.sharing-plugin.io"
NODE = "node-a"


@pytest.fixture
async def api() -> AsyncIterator[FakeKubeApi]:
    async with FakeKubeApi() as server:
        server.put_node(NODE)
        yield server


async def client_for(api: FakeKubeApi, tmp_path: Path, token: str | None = None) -> Any:
    path = api.kubeconfig(tmp_path / f"kubeconfig-{token}", token=token)
    return lightkube.AsyncClient(config=lightkube.KubeConfig.from_file(path))


@pytest.fixture
async def client(api: FakeKubeApi, tmp_path: Path) -> AsyncIterator[Any]:
    c = await client_for(api, tmp_path)
    try:
        yield c
    finally:
        await c.close()


def slices(api: FakeKubeApi) -> list[dict[str, Any]]:
    return api.dra_objects("resourceslices")


async def test_discovery_picks_v1_then_v1beta1(api: FakeKubeApi, client: Any) -> None:
    assert await discover_version(client) == V1
    api.dra_versions = ("v1beta1",)
    assert await discover_version(client) == V1BETA1
    api.dra_versions = ()
    with pytest.raises(KubeApiError, match=r"serves none of resource.k8s.io/v1, .*1\.32"):
        await discover_version(client)


async def test_publish_splits_the_pool_and_owns_it_by_the_node(
    api: FakeKubeApi, client: Any
) -> None:
    publisher = SlicePublisher(client, driver=DRIVER, node_name=NODE, api_version=V1)
    devices = published_devices(gpus=8, replicas=20)
    assert await publisher.publish(devices)
    found = slices(api)
    assert [len(s["spec"]["devices"]) for s in found] == [128, 32]
    node_uid = api.node(NODE)["metadata"]["uid"]
    for s in found:
        assert s["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 2}
        assert s["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node_uid}
        ]
    assert [d["name"] for s in found for d in s["spec"]["devices"]] == [d.name for d in devices]


async def test_republish_bumps_the_generation_and_deletes_what_is_not_needed(
    api: FakeKubeApi, client: Any
) -> None:
    publisher = SlicePublisher(client, driver=DRIVER, node_name=NODE, api_version=V1)
    await publisher.publish(published_devices(gpus=8, replicas=20))
    versions = {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in slices(api)}
    assert not await publisher.publish(published_devices(gpus=8, replicas=20))
    assert {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in slices(api)} == (
        versions
    )
    assert await publisher.publish(published_devices(gpus=8, replicas=4))
    (only,) = slices(api)
    assert only["metadata"]["name"] == f"{NODE}-{DRIVER}-0"
    assert only["spec"]["pool"] == {"name": NODE, "generation": 2, "resourceSliceCount": 1}
    assert len(only["spec"]["devices"]) == 32
    assert await publisher.publish(())
    assert slices(api) == []


async def test_a_forced_publish_brings_back_slices_deleted_behind_its_back(
    api: FakeKubeApi, client: Any
) -> None:
    publisher = SlicePublisher(client, driver=DRIVER, node_name=NODE, api_version=V1)
    devices = published_devices(gpus=2, replicas=1)
    await publisher.publish(devices)
    assert not await publisher.publish(devices, force=True)  # all there: nothing to write
    api.delete_dra_object("resourceslices", f"{NODE}-{DRIVER}-0")  # as the kubelet wipes them
    assert not await publisher.publish(devices)
    assert await publisher.publish(devices, force=True)
    (back,) = slices(api)
    assert back["spec"]["pool"]["generation"] == 2


async def test_a_new_run_continues_past_the_last_generation_and_leaves_others_alone(
    api: FakeKubeApi, client: Any
) -> None:
    old = SlicePublisher(client, driver=DRIVER, node_name=NODE, api_version=V1)
    for replicas in (18, 19, 20):
        await old.publish(published_devices(gpus=8, replicas=replicas))
    api.put_dra_object(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": "someone-else"},
            "spec": {
                "driver": "gpu.nvidia.com",
                "nodeName": NODE,
                "pool": {"name": NODE, "generation": 9, "resourceSliceCount": 1},
                "devices": [],
            },
        }
    )
    new = SlicePublisher(client, driver=DRIVER, node_name=NODE, api_version=V1)
    await new.start()
    assert new.generation == 3
    await new.publish(published_devices(gpus=1, replicas=1))
    names = [s["metadata"]["name"] for s in slices(api)]
    assert names == [f"{NODE}-{DRIVER}-0", "someone-else"]
    assert slices(api)[0]["spec"]["pool"]["generation"] == 4
    await new.clear()
    assert [s["metadata"]["name"] for s in slices(api)] == ["someone-else"]


async def test_a_v1beta1_server_gets_basic_devices(
    api: FakeKubeApi, client: Any, tmp_path: Path
) -> None:
    api.dra_versions = ("v1beta1",)
    version = await discover_version(client)
    publisher = SlicePublisher(client, driver=DRIVER, node_name=NODE, api_version=version)
    await publisher.publish(published_devices(gpus=1, replicas=2))
    async with httpx2.AsyncClient(base_url=api.url) as http:
        raw = (await http.get("/apis/resource.k8s.io/v1beta1/resourceslices")).json()
        assert (await http.get("/apis/resource.k8s.io/v1/resourceslices")).status_code == 404
    (item,) = raw["items"]
    assert [set(d) for d in item["spec"]["devices"]] == [{"name", "basic"}] * 2
    assert item["spec"]["devices"][0]["basic"]["attributes"]["replica"] == {"int": 0}
    (stored,) = slices(api)  # the fake stores v1, as kube-apiserver converts
    assert set(stored["spec"]["devices"][0]) == {"name", "attributes", "capacity"}


async def test_refusals_name_the_missing_permission(api: FakeKubeApi, tmp_path: Path) -> None:
    api._tokens = {"t": permissions(("get", "nodes"), ("list", "resourceslices"))}
    c = await client_for(api, tmp_path, token="t")
    try:
        publisher = SlicePublisher(c, driver=DRIVER, node_name=NODE, api_version=V1)
        with pytest.raises(KubeApiError) as caught:
            await publisher.publish(published_devices(gpus=1, replicas=1))
    finally:
        await c.close()
    assert caught.value.code == 403
    assert "grant the plugin's service account update on resourceslices" in str(caught.value)
    assert 'in API group "resource.k8s.io"' in str(caught.value)


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
async def test_claims_are_read_in_either_version(
    api: FakeKubeApi, client: Any, version: str
) -> None:
    api.dra_versions = (version,)
    request: dict[str, Any] = {"name": "gpu", "deviceClassName": "gpu.gpu.sharing-plugin.io"}
    if version == "v1":
        request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.gpu.sharing-plugin.io"}}
    stored = api.put_dra_object(
        {
            "apiVersion": f"resource.k8s.io/{version}",
            "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "default"},
            "spec": {"devices": {"requests": [request]}},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-x"}
                        ]
                    }
                }
            },
        }
    )
    assert stored["spec"]["devices"]["requests"][0]["exactly"] == {
        "deviceClassName": "gpu.gpu.sharing-plugin.io"
    }
    reader = ApiClaimReader(client, f"resource.k8s.io/{version}")
    claim = await reader.read(ClaimRef("default", "c", stored["metadata"]["uid"]))
    assert claim.ref.uid == stored["metadata"]["uid"]
    assert claim.devices is not None
    assert [(d.request, d.driver, d.pool, d.device) for d in claim.devices] == [
        ("gpu", DRIVER, NODE, "gpu-x")
    ]
    with pytest.raises(KubeApiError, match="404"):
        await reader.read(ClaimRef("default", "nope", "u"))


def test_the_fake_refuses_slices_the_api_refuses(api: FakeKubeApi) -> None:
    def slice_with(devices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": "s"},
            "spec": {
                "driver": DRIVER,
                "nodeName": NODE,
                "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                "devices": devices,
            },
        }

    with pytest.raises(ValueError, match="at most 128"):
        api.put_dra_object(slice_with([{"name": f"d{i}"} for i in range(129)]))
    with pytest.raises(ValueError, match="must be a DNS label"):
        api.put_dra_object(slice_with([{"name": "GPU-1"}]))
    with pytest.raises(ValueError, match="Duplicate value"):
        api.put_dra_object(slice_with([{"name": "a"}, {"name": "a"}]))
    with pytest.raises(ValueError, match="at most 64"):
        api.put_dra_object(slice_with([{"name": "a", "attributes": {"x": {"string": "y" * 65}}}]))
    with pytest.raises(ValueError, match=r"not a field of resource\.k8s\.io/v1"):
        api.put_dra_object(slice_with([{"name": "a", "basic": {}}]))
