"""The DRA kubelet API's .proto files say what the published API says on the wire (that the
committed code is what they generate is checked with the kubelet API's, by the generator's
test)."""

from __future__ import annotations

from sharing_plugin.dra.api.dra.v1 import api_pb2 as v1
from sharing_plugin.dra.api.dra.v1beta1 import api_pb2 as v1beta1
from sharing_plugin.dra.api.pluginregistration.v1 import api_pb2 as reg


def fields(message: type) -> dict[str, int]:
    return {f.name: f.number for f in message.DESCRIPTOR.fields}  # type: ignore[attr-defined]


def test_packages_and_services_are_the_published_ones() -> None:
    assert reg.DESCRIPTOR.package == "pluginregistration"
    assert v1beta1.DESCRIPTOR.package == "k8s.io.kubelet.pkg.apis.dra.v1beta1"
    assert v1.DESCRIPTOR.package == "k8s.io.kubelet.pkg.apis.dra.v1"
    registration = reg.DESCRIPTOR.services_by_name["Registration"]
    assert registration.full_name == "pluginregistration.Registration"
    assert [m.name for m in registration.methods] == ["GetInfo", "NotifyRegistrationStatus"]
    for module in (v1beta1, v1):
        service = module.DESCRIPTOR.services_by_name["DRAPlugin"]
        assert service.full_name == f"{module.DESCRIPTOR.package}.DRAPlugin"
        assert [m.name for m in service.methods] == [
            "NodePrepareResources",
            "NodeUnprepareResources",
        ]


def test_wire_names_and_numbers_match_the_published_api() -> None:
    assert fields(reg.PluginInfo) == {
        "type": 1,
        "name": 2,
        "endpoint": 3,
        "supported_versions": 4,
    }
    assert fields(reg.RegistrationStatus) == {"plugin_registered": 1, "error": 2}
    assert fields(reg.InfoRequest) == {}
    assert fields(reg.RegistrationStatusResponse) == {}
    for module in (v1beta1, v1):
        assert fields(module.Claim) == {"namespace": 1, "uid": 2, "name": 3}
        assert fields(module.NodePrepareResourcesRequest) == {"claims": 1}
        assert fields(module.NodePrepareResourcesResponse) == {"claims": 1}
        assert fields(module.NodePrepareResourceResponse) == {"devices": 1, "error": 2}
        assert fields(module.NodeUnprepareResourcesRequest) == {"claims": 1}
        assert fields(module.NodeUnprepareResourcesResponse) == {"claims": 1}
        assert fields(module.NodeUnprepareResourceResponse) == {"error": 1}
    assert fields(v1beta1.Device) == {
        "request_names": 1,
        "pool_name": 2,
        "device_name": 3,
        "cdi_device_ids": 4,
    }
    assert fields(v1.Device) == {
        "request_names": 1,
        "pool_name": 2,
        "device_name": 3,
        "cdi_device_ids": 4,
        "share_id": 5,
    }
    # The response maps are keyed by claim UID.
    claims = v1.NodePrepareResourcesResponse.DESCRIPTOR.fields_by_name["claims"]
    assert claims.message_type.GetOptions().map_entry
