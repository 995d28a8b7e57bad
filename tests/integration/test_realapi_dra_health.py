"""Device taints of Unhealthy GPUs on a real kube-apiserver 1.36 (tests/realapi.py): the start-up
probe finds that the server keeps them (and leaves nothing behind), and a pool with tainted
devices, as run-dra publishes it, passes the server's validation (taint values are label
values, 64 devices to a slice with taints). Skipped where ../shared/tools is absent.
"""

from __future__ import annotations

import pytest
import realapi
from dra_support import inventory
from realapi_support import admin

from sharing_plugin.config.base import SharedDevices
from sharing_plugin.config.model import Config
from sharing_plugin.dra.features import keeps_device_taints
from sharing_plugin.dra.resources import generic, resource_class
from sharing_plugin.gpus.health_tracker import Cause, Fault
from sharing_plugin.plan import plan
from sharing_plugin.views.dra import dra_devices, pool_devices
from sharing_plugin.views.dra_api import V1, resource_slices
from sharing_plugin.views.dra_health import health_taints

pytestmark = [
    pytest.mark.skipif(not realapi.AVAILABLE, reason=realapi.SKIP_REASON),
    pytest.mark.realtools,
]

DRIVER = "gpu.sharing-plugin.io"


async def test_the_probe_finds_taints_kept_and_stores_nothing(real_api: realapi.RealApi) -> None:
    name = realapi.unique("node")
    async with admin(real_api) as client:
        assert await keeps_device_taints(client, driver=DRIVER, node_name=name) is True
        slices = resource_class(V1, "ResourceSlice")
        left = [s async for s in client.list(slices, fields={"spec.nodeName": name})]
        assert left == []


async def test_a_pool_with_tainted_devices_passes_the_servers_validation(
    real_api: realapi.RealApi,
) -> None:
    # 8 GPUs x 10 replicas, GPU 0 lost and GPU 5 with a Xid: 80 devices, 20 tainted, so two
    # slices of at most 64 (one slice of 80 with taints is refused).
    gpus = inventory()  # a DGX A100: 8 GPUs
    faults = {
        gpus.gpus[0].uuid: Fault(Cause.LOST, None, "NVML_ERROR_GPU_IS_LOST"),
        gpus.gpus[5].uuid: Fault(Cause.XID, 79, "Xid 79"),
    }
    sharing = {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 10}]}}
    p = plan(Config.model_validate({"version": "v1", "sharing": sharing}), gpus)
    sick = p.with_health({u: False for u in faults})
    devices = dra_devices(sick, gpus, shared=SharedDevices.REPLICAS)
    pool = pool_devices(devices, taints=health_taints(faults, DRIVER))
    name = realapi.unique("node")
    documents = resource_slices(pool, node_name=name, driver=DRIVER, generation=1, api_version=V1)
    assert [len(d["spec"]["devices"]) for d in documents] == [64, 16]
    async with admin(real_api) as client:
        for document in documents:
            stored = (await client.create(generic(V1, document))).to_dict()
            values = {t["value"] for d in stored["spec"]["devices"] for t in d.get("taints") or ()}
            assert values <= {"lost", "xid-79"}
        kind = resource_class(V1, "ResourceSlice")
        tainted = [
            t
            async for s in client.list(kind, fields={"spec.nodeName": name})
            for d in s.to_dict()["spec"]["devices"]
            for t in d.get("taints") or ()
        ]
        assert len(tainted) == 20
        assert {(t["key"], t["effect"]) for t in tainted} == {(f"{DRIVER}/unhealthy", "NoSchedule")}
        for document in documents:
            await client.delete(kind, document["metadata"]["name"])
