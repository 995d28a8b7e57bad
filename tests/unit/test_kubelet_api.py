"""The kubelet API's .proto files say what the published API says on the wire (that the committed
code is what they generate is checked with the DRA API's, by the generator's test)."""

from __future__ import annotations

from sharing_plugin.kubelet.api.deviceplugin.v1beta1 import api_pb2 as dp
from sharing_plugin.kubelet.api.podresources.v1 import api_pb2 as pr


def test_both_apis_live_in_one_descriptor_pool_under_their_own_paths() -> None:
    assert dp.DESCRIPTOR.name == "sharing_plugin/kubelet/api/deviceplugin/v1beta1/api.proto"
    assert pr.DESCRIPTOR.name == "sharing_plugin/kubelet/api/podresources/v1/api.proto"
    assert dp.DESCRIPTOR.package == "v1beta1"
    assert pr.DESCRIPTOR.package == "v1"


def test_wire_names_and_numbers_match_the_published_api() -> None:
    def fields(message: type) -> dict[str, int]:
        return {f.name: f.number for f in message.DESCRIPTOR.fields}  # type: ignore[attr-defined]

    assert fields(dp.RegisterRequest) == {
        "version": 1,
        "endpoint": 2,
        "resource_name": 3,
        "options": 4,
    }
    assert fields(dp.DevicePluginOptions) == {
        "pre_start_required": 1,
        "get_preferred_allocation_available": 2,
    }
    assert fields(dp.Device) == {"ID": 1, "health": 2, "topology": 3}
    assert fields(dp.ContainerPreferredAllocationRequest) == {
        "available_deviceIDs": 1,
        "must_include_deviceIDs": 2,
        "allocation_size": 3,
    }
    assert fields(dp.ContainerAllocateRequest) == {"devices_ids": 1}
    assert fields(dp.ContainerAllocateResponse) == {
        "envs": 1,
        "mounts": 2,
        "devices": 3,
        "annotations": 4,
        "cdi_devices": 5,
    }
    assert fields(pr.ContainerResources) == {
        "name": 1,
        "devices": 2,
        "cpu_ids": 3,
        "memory": 4,
        "dynamic_resources": 5,
    }
    assert fields(pr.GetPodResourcesRequest) == {"pod_name": 1, "pod_namespace": 2}
    services = {
        s.name: [m.name for m in s.methods] for s in dp.DESCRIPTOR.services_by_name.values()
    }
    assert services == {
        "Registration": ["Register"],
        "DevicePlugin": [
            "GetDevicePluginOptions",
            "ListAndWatch",
            "GetPreferredAllocation",
            "Allocate",
            "PreStartContainer",
        ],
    }
    lister = pr.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert [m.name for m in lister.methods] == ["List", "GetAllocatableResources", "Get"]
