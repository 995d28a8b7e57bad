"""The plan as DRA devices, ResourceSlices and DeviceClasses (docs/contract.md, "DRA mode")."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from plan_factory import T4, config, gpu, mps, node, time_slicing
from test_plan_properties import nodes, shared_configs

from sharing_plugin.config.base import SharedDevices
from sharing_plugin.errors import PlanError
from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.plan import plan
from sharing_plugin.plan.model import Plan
from sharing_plugin.plan.node import plan_node
from sharing_plugin.views.dra import DraDevice, dra_devices, dra_documents, pool_devices
from sharing_plugin.views.dra_api import (
    MAX_DEVICES_PER_SLICE,
    MAX_DEVICES_WITH_TAINTS_OR_COUNTERS,
    V1,
    V1BETA1,
    Capacity,
    CounterSet,
    DeviceTaint,
    PublishedDevice,
    device_class,
    device_class_name,
    dns_label,
    dropped_features,
    memory_quantity,
    quantity_mib,
    resource_slices,
)

DRIVER = "gpu.sharing-plugin.io"
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def attributes(device: PublishedDevice) -> dict[str, Any]:
    return {k: next(iter(v.values())) for k, v in device.attributes.items()}


def published(
    cfg_inventory: tuple[Any, Inventory], shared: SharedDevices = SharedDevices.REPLICAS
) -> dict[str, PublishedDevice]:
    cfg, inventory = cfg_inventory
    devices = pool_devices(dra_devices(plan(cfg, inventory), inventory, shared=shared))
    return {d.name: d for d in devices}


def by_replica(p: Plan, inventory: Inventory) -> tuple[DraDevice, ...]:
    """The plan's devices in the model of one DRA device per replica."""
    return dra_devices(p, inventory, shared=SharedDevices.REPLICAS)


def test_whole_gpu_device_name_attributes_and_memory() -> None:
    inventory = node(gpu(0), gpu(1, product=T4))
    devices = published((config(), inventory))
    whole = devices["gpu-00000000-0000-4000-8000-000000000000"]
    assert attributes(whole) == {
        "type": "gpu",
        "resource": "nvidia.com/gpu",
        "uuid": "GPU-00000000-0000-4000-8000-000000000000",
        "productName": "NVIDIA A100-SXM4-80GB",
        "sharing": "none",
        "index": 0,
        # What the inventory knows of the GPU (no architecture, brand or driver here).
        "cudaComputeCapability": "8.0.0",
        "pcieBusID": "0000:01:00.0",
        "resource.kubernetes.io/pciBusID": "0000:01:00.0",
        "resource.kubernetes.io/numaNode": 0,
    }
    assert whole.capacity == {"memory": Capacity("80Gi")}
    assert not whole.multiple_allocations
    assert attributes(devices["gpu-00000001-0000-4000-8000-000000000000"])["productName"] == T4


def test_replicas_carry_replica_and_sharing_and_never_the_whole_gpu() -> None:
    inventory = node(gpu(0), gpu(1))
    cfg = time_slicing({"name": "gpu", "devices": [0], "replicas": 3}, renameByDefault=True)
    devices = published((cfg, inventory))
    assert sorted(devices) == [
        "gpu-00000000-0000-4000-8000-000000000000-r0",
        "gpu-00000000-0000-4000-8000-000000000000-r1",
        "gpu-00000000-0000-4000-8000-000000000000-r2",
        "gpu-00000001-0000-4000-8000-000000000000",
    ]
    r1 = attributes(devices["gpu-00000000-0000-4000-8000-000000000000-r1"])
    assert r1["resource"] == "nvidia.com/gpu.shared"
    assert r1["sharing"] == "time-slicing"
    assert r1["replica"] == 1
    assert "migProfile" not in r1


def test_mig_devices_carry_their_profile_gpu_index_and_own_memory() -> None:
    inventory = node(gpu(0), gpu(3, migs=("1g.10gb", "3g.40gb")))
    cfg = config(flags={"migStrategy": "mixed"})
    devices = published((cfg, inventory))
    mig = devices["mig-00030001-0000-4000-8000-000000000000"]
    assert attributes(mig) == {
        "type": "mig",
        "resource": "nvidia.com/mig-3g.40gb",
        "uuid": "MIG-00030001-0000-4000-8000-000000000000",
        "parentUUID": "GPU-00000003-0000-4000-8000-000000000000",
        "productName": "NVIDIA A100-SXM4-80GB",
        "sharing": "none",
        "index": 3,
        "migProfile": "3g.40gb",
        "profile": "3g.40gb",
        "cudaComputeCapability": "8.0.0",
        "pcieBusID": "0000:04:00.0",
        "resource.kubernetes.io/pciBusID": "0000:04:00.0",
        "resource.kubernetes.io/numaNode": 0,
    }
    assert mig.capacity == {"memory": Capacity(memory_quantity(40_000))}
    assert memory_quantity(40_000) == "40000Mi"


def test_mps_replicas_say_mps() -> None:
    devices = published((mps({"name": "gpu", "replicas": 2}), node(gpu(0))))
    assert {attributes(d)["sharing"] for d in devices.values()} == {"mps"}


def test_names_are_stable_when_replicas_change() -> None:
    inventory = node(gpu(0), gpu(1))
    two = published((time_slicing({"name": "gpu", "replicas": 2}), inventory))
    five = published((time_slicing({"name": "gpu", "replicas": 5}), inventory))
    assert set(two) < set(five)
    for name, device in two.items():
        assert five[name] == device


def test_memory_quantities_are_canonical() -> None:
    assert memory_quantity(81_920) == "80Gi"
    assert memory_quantity(15_360) == "15Gi"
    assert memory_quantity(9_728) == "9728Mi"
    assert memory_quantity(1024 * 1024 * 2) == "2Ti"
    assert memory_quantity(0) == "0Mi"


def test_dns_label_cuts_long_names_with_a_hash() -> None:
    long = dns_label("MIG-planned-" + "x" * 80)
    assert len(long) == 63 and DNS_LABEL.fullmatch(long)
    assert long != dns_label("MIG-planned-" + "x" * 81)
    assert dns_label("GPU-ABC_def") == "gpu-abc-def"


def test_slices_split_at_128_devices_with_one_generation_and_count() -> None:
    inventory = node(*(gpu(i) for i in range(8)))
    cfg = time_slicing({"name": "gpu", "replicas": 20})
    devices = pool_devices(by_replica(plan(cfg, inventory), inventory))
    slices = resource_slices(devices, node_name="node-a", driver=DRIVER, generation=7)
    assert [len(s["spec"]["devices"]) for s in slices] == [128, 32]
    assert [s["metadata"]["name"] for s in slices] == [
        "node-a-gpu.sharing-plugin.io-0",
        "node-a-gpu.sharing-plugin.io-1",
    ]
    for s in slices:
        assert s["apiVersion"] == V1 and s["kind"] == "ResourceSlice"
        assert s["spec"]["pool"] == {"name": "node-a", "generation": 7, "resourceSliceCount": 2}
        assert s["spec"]["nodeName"] == "node-a"
        assert s["spec"]["driver"] == DRIVER
    first = slices[0]["spec"]["devices"][0]
    assert set(first) == {"name", "attributes", "capacity"}
    assert first["capacity"]["memory"] == {"value": "80Gi"}
    assert resource_slices((), node_name="n", driver=DRIVER, generation=1) == []


def test_v1beta1_slices_wrap_devices_in_basic() -> None:
    inventory = node(gpu(0))
    devices = pool_devices(dra_devices(plan(config(), inventory), inventory))
    (s,) = resource_slices(devices, node_name="n", driver=DRIVER, generation=1, api_version=V1BETA1)
    assert s["apiVersion"] == V1BETA1
    (device,) = s["spec"]["devices"]
    assert set(device) == {"name", "basic"}
    assert device["basic"]["attributes"]["index"] == {"int": 0}
    assert device["basic"]["capacity"] == {"memory": {"value": "80Gi"}}


def test_unhealthy_devices_leave_the_pool() -> None:
    inventory = node(gpu(0), gpu(1))
    p = plan(time_slicing({"name": "gpu", "replicas": 2}), inventory)
    sick = p.with_health({"GPU-00000000-0000-4000-8000-000000000000": False})
    names = [d.name for d in pool_devices(by_replica(sick, inventory))]
    assert names == [
        "gpu-00000001-0000-4000-8000-000000000000-r0",
        "gpu-00000001-0000-4000-8000-000000000000-r1",
    ]


def test_held_devices_the_plan_dropped_stay_published_unchanged() -> None:
    inventory = node(gpu(0))
    before = pool_devices(
        by_replica(plan(time_slicing({"name": "gpu", "replicas": 4}), inventory), inventory)
    )
    kept = {d.name: d for d in before}
    held = {"gpu-00000000-0000-4000-8000-000000000000-r3", "gone-elsewhere"}
    after = pool_devices(
        by_replica(plan(time_slicing({"name": "gpu", "replicas": 2}), inventory), inventory),
        held=held,
        kept=kept,
    )
    assert [d.name for d in after] == [
        "gpu-00000000-0000-4000-8000-000000000000-r0",
        "gpu-00000000-0000-4000-8000-000000000000-r1",
        "gpu-00000000-0000-4000-8000-000000000000-r3",
    ]
    assert after[-1] == kept["gpu-00000000-0000-4000-8000-000000000000-r3"]


def test_a_shared_device_the_plan_dropped_drains_with_a_taint_where_taints_are_kept() -> None:
    inventory = node(gpu(0), gpu(1))
    shared = plan(time_slicing({"name": "gpu", "replicas": 4}), inventory)
    before = pool_devices(dra_devices(shared, inventory, shared=SharedDevices.CAPACITY))
    kept = {d.name: d for d in before}
    held = {before[0].name}  # shares of GPU 0 held by claims
    assert before[0].multiple_allocations
    only_gpu1 = dra_devices(
        plan(time_slicing({"name": "gpu", "replicas": 4}), node(gpu(1))),
        node(gpu(1)),
        shared=SharedDevices.CAPACITY,
    )
    draining = DeviceTaint("gpu.sharing-plugin.io/draining", "removed-from-config")
    after = pool_devices(only_gpu1, held=held, kept=kept, taints={}, draining=draining)
    assert [d.name for d in after] == [before[1].name, before[0].name]
    assert after[-1].taints == (draining,)  # its free shares go to no new claim
    assert dataclasses.replace(after[-1], taints=()) == kept[before[0].name]
    # Without taints on the server it stays as it was published.
    assert pool_devices(only_gpu1, held=held, kept=kept)[-1] == kept[before[0].name]


def test_held_but_unhealthy_devices_leave_the_pool_too() -> None:
    inventory = node(gpu(0))
    p = plan(config(), inventory).with_health({"GPU-00000000-0000-4000-8000-000000000000": False})
    devices = dra_devices(p, inventory)
    kept = {d.name: d.published() for d in devices}
    assert pool_devices(devices, held=set(kept), kept=kept) == ()


def test_published_device_round_trips_through_json() -> None:
    (device,) = pool_devices(dra_devices(plan(config(), node(gpu(0))), node(gpu(0))))
    assert PublishedDevice.from_json(device.to_json()) == device


def test_device_class_names() -> None:
    assert device_class_name("nvidia.com/gpu", DRIVER) == "gpu.gpu.sharing-plugin.io"
    assert device_class_name("nvidia.com/gpu.shared", DRIVER) == "gpu.shared.gpu.sharing-plugin.io"
    assert (
        device_class_name("nvidia.com/mig-1g.10gb", DRIVER) == "mig-1g.10gb.gpu.sharing-plugin.io"
    )
    assert device_class_name("example.com/a_b", DRIVER) == "a-b.example.com.gpu.sharing-plugin.io"


def test_dra_documents_classes_for_plan_and_config_names_then_slices() -> None:
    inventory = node(gpu(0))
    cfg = config(
        resources={"gpus": [{"pattern": "Tesla T4", "name": "gpu.other"}]},
        sharing={"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2}]}},
    )
    docs = dra_documents(cfg, plan_node(cfg, inventory, as_is=True), "node-a", DRIVER)
    classes = [d for d in docs if d["kind"] == "DeviceClass"]
    assert [c["metadata"]["name"] for c in classes] == [
        "gpu.gpu.sharing-plugin.io",
        "gpu.other.gpu.sharing-plugin.io",
    ]
    assert classes[0]["spec"]["selectors"] == [
        {
            "cel": {
                "expression": 'device.driver == "gpu.sharing-plugin.io" && '
                'device.attributes["gpu.sharing-plugin.io"].resource == "nvidia.com/gpu"'
            }
        }
    ]
    assert [d["kind"] for d in docs[len(classes) :]] == ["ResourceSlice"]
    assert all(d["apiVersion"] == V1 for d in docs)
    # Each class claims its resource name as extended resource (unique: one class per name),
    # so a pod asking nvidia.com/gpu as for the device plugin is served from it.
    assert [c["spec"]["extendedResourceName"] for c in classes] == [
        "nvidia.com/gpu",
        "nvidia.com/gpu.other",
    ]


def test_a_v1beta1_class_claims_no_extended_resource() -> None:
    # resource.k8s.io/v1beta1 is spoken to 1.32-1.33 servers, which have no such field.
    assert (
        "extendedResourceName"
        not in device_class("nvidia.com/gpu", DRIVER, api_version=V1BETA1)["spec"]
    )
    assert (
        device_class("nvidia.com/gpu", DRIVER)["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    )


def test_a_resource_name_too_long_for_an_attribute_is_refused() -> None:
    inventory = node(gpu(0))
    long = "example.com/" + "g" * 60
    cfg = config(resources={"gpus": [{"pattern": "*", "name": long}]})
    with pytest.raises(PlanError, match="at most 64 characters"):
        dra_devices(plan(cfg, inventory), inventory)


@settings(max_examples=50, deadline=None)
@given(st.data())
def test_every_plan_device_is_one_uniquely_named_dra_device(data: st.DataObject) -> None:
    inventory = data.draw(nodes())
    cfg, _ = data.draw(shared_configs(inventory))
    p = plan(cfg, inventory)
    devices = by_replica(p, inventory)
    assert [d.device for d in devices] == [d for r in p.resources for d in r.devices]
    names = [d.name for d in devices]
    assert len(names) == len(set(names))
    assert all(DNS_LABEL.fullmatch(n) for n in names)
    generation = data.draw(st.integers(1, 10**6))
    slices = resource_slices(
        pool_devices(devices), node_name="node-a", driver=DRIVER, generation=generation
    )
    assert all(len(s["spec"]["devices"]) <= MAX_DEVICES_PER_SLICE for s in slices)
    assert [d["name"] for s in slices for d in s["spec"]["devices"]] == names
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} <= {len(slices)}
    for s in slices:
        assert DNS_SUBDOMAIN.fullmatch(s["metadata"]["name"])
        for device in s["spec"]["devices"]:
            assert len(device["attributes"]) + len(device["capacity"]) <= 32
            assert all(
                len(v["string"]) <= 64 for v in device["attributes"].values() if "string" in v
            )


@settings(max_examples=30, deadline=None)
@given(nodes(), st.integers(1, 5), st.integers(0, 5))
def test_names_survive_replica_increases(inventory: Inventory, low: int, extra: int) -> None:
    def names(replicas: int) -> set[str]:
        cfg = time_slicing({"name": "gpu", "replicas": replicas})
        return {d.name for d in by_replica(plan(cfg, inventory), inventory)}

    assert names(low) <= names(low + extra)


# ---- shared GPUs as consumable capacity --------------------------------------------------------

CAPACITY = SharedDevices.CAPACITY
GPU0 = "gpu-00000000-0000-4000-8000-000000000000"
GPU1 = "gpu-00000001-0000-4000-8000-000000000000"


def test_a_shared_gpu_is_one_device_whose_memory_claims_consume() -> None:
    inventory = node(gpu(0), gpu(1))
    cfg = time_slicing({"name": "gpu", "devices": [0], "replicas": 4}, renameByDefault=True)
    devices = published((cfg, inventory), CAPACITY)
    assert sorted(devices) == [GPU0, GPU1]
    shared = devices[GPU0]
    assert shared.multiple_allocations
    # 80 GiB in four shares: a claim that asks nothing takes 20 GiB, one may ask up to all four.
    assert shared.capacity == {
        "memory": Capacity("80Gi", default="20Gi", minimum="20Gi", maximum="80Gi", step="20Gi")
    }
    assert "replica" not in attributes(shared)
    assert attributes(shared)["sharing"] == "time-slicing"
    whole = devices[GPU1]
    assert not whole.multiple_allocations and whole.capacity == {"memory": Capacity("80Gi")}


def test_a_share_that_does_not_divide_the_memory_keeps_whole_shares_within_it() -> None:
    inventory = node(gpu(0))
    (device,) = published(
        (time_slicing({"name": "gpu", "replicas": 3}), inventory), CAPACITY
    ).values()
    document = device.document(V1)
    # 81920 MiB / 3 = 27306 MiB each; the API wants the range's max a whole number of steps.
    assert document["capacity"]["memory"] == {
        "value": "80Gi",
        "requestPolicy": {
            "default": "27306Mi",
            "validRange": {"min": "27306Mi", "max": "81918Mi", "step": "27306Mi"},
        },
    }
    assert document["allowMultipleAllocations"] is True


def test_one_share_alone_has_no_step() -> None:
    # memoryPerReplica 10Gi on a 15 GiB T4: one client; min + step would pass the capacity
    # (the real API server refuses that).
    inventory = node(dataclasses.replace(gpu(0, product=T4), memory_mib=15360))
    cfg = mps({"name": "gpu", "memoryPerReplica": "10Gi"})
    (device,) = published((cfg, inventory), CAPACITY).values()
    assert device.capacity["memory"] == Capacity(
        "15Gi", default="10Gi", minimum="10Gi", maximum="10Gi"
    )
    assert device.document(V1)["capacity"]["memory"]["requestPolicy"]["validRange"] == {
        "min": "10Gi",
        "max": "10Gi",
    }


def test_mps_memory_per_replica_sets_the_share() -> None:
    inventory = node(gpu(0))
    cfg = mps({"name": "gpu", "memoryPerReplica": "10Gi"})
    (device,) = published((cfg, inventory), CAPACITY).values()
    memory = device.capacity["memory"]
    assert (memory.default, memory.step, memory.maximum) == ("10Gi", "10Gi", "80Gi")
    assert attributes(device)["sharing"] == "mps"


def test_mig_devices_shared_by_capacity_take_their_own_memory() -> None:
    inventory = node(gpu(3, migs=("1g.10gb", "3g.40gb")))
    cfg = config(
        flags={"migStrategy": "mixed"},
        sharing={"timeSlicing": {"resources": [{"name": "mig-3g.40gb", "replicas": 2}]}},
    )
    devices = published((cfg, inventory), CAPACITY)
    shared = devices["mig-00030001-0000-4000-8000-000000000000"]
    assert shared.capacity["memory"] == Capacity(
        "40000Mi", default="20000Mi", minimum="20000Mi", maximum="40000Mi", step="20000Mi"
    )


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_by_capacity_every_physical_device_is_one_dra_device_and_the_shares_fit(
    data: st.DataObject,
) -> None:
    inventory = data.draw(nodes())
    cfg, _ = data.draw(shared_configs(inventory))
    p = plan(cfg, inventory)
    devices = dra_devices(p, inventory, shared=CAPACITY)
    physical = [(r.name, d.physical) for r in p.resources for d in r.devices]
    assert [(d.resource, d.device.physical) for d in devices] == list(dict.fromkeys(physical))
    for d in devices:
        resource = p.resource(d.resource)
        assert resource is not None
        count = sum(1 for v in resource.devices if v.physical == d.device.physical)
        if d.shares is None:
            assert count == 1
            continue
        # At most `replicas` claims that ask nothing fit, and never more memory than there is.
        assert d.shares.count == count and d.shares.mib * count <= d.memory_mib
        assert d.memory_mib // d.shares.mib >= count
        # What the API server checks of a request policy (kube-apiserver 1.36's validation):
        # default within the range, max a whole number of steps from min, min + step within
        # the capacity's value.
        memory = d.capacity()
        value, default, low, high = (
            quantity_mib(q or "")
            for q in (memory.value, memory.default, memory.minimum, memory.maximum)
        )
        assert None not in (value, default, low, high)
        assert low <= default <= high <= value  # type: ignore[operator]
        if memory.step is not None:
            step = quantity_mib(memory.step)
            assert step and (high - low) % step == 0 and low + step <= value  # type: ignore[operator]


def test_unhealthy_devices_stay_published_with_their_gpus_taint() -> None:
    inventory = node(gpu(0), gpu(1))
    p = plan(time_slicing({"name": "gpu", "replicas": 2}), inventory)
    sick = p.with_health({"GPU-00000000-0000-4000-8000-000000000000": False})
    taint = DeviceTaint("gpu.sharing-plugin.io/unhealthy", "xid-79")
    devices = dra_devices(sick, inventory, shared=CAPACITY)
    pool = pool_devices(devices, taints={"GPU-00000000-0000-4000-8000-000000000000": taint})
    assert [(d.name, d.taints) for d in pool] == [(GPU0, (taint,)), (GPU1, ())]
    assert pool[0].document(V1)["taints"] == [
        {"key": "gpu.sharing-plugin.io/unhealthy", "value": "xid-79", "effect": "NoSchedule"}
    ]
    # Without taints (a server that has none) an unhealthy device leaves the pool.
    assert [d.name for d in pool_devices(devices)] == [GPU1]


def test_devices_with_taints_or_counters_fill_slices_of_64() -> None:
    plain = [PublishedDevice(f"d{i}", {}, {}) for i in range(130)]
    tainted = [PublishedDevice(f"t{i}", {}, {}, taints=(DeviceTaint("k", "v"),)) for i in range(70)]
    slices = resource_slices([*plain, *tainted], node_name="n", driver=DRIVER, generation=1)
    assert [len(s["spec"]["devices"]) for s in slices] == [128, 64, 8]
    for s in slices:
        limited = any("taints" in d for d in s["spec"]["devices"])
        limit = MAX_DEVICES_WITH_TAINTS_OR_COUNTERS if limited else MAX_DEVICES_PER_SLICE
        assert len(s["spec"]["devices"]) <= limit


def test_counter_sets_are_slices_of_their_own_of_at_most_8() -> None:
    sets = [CounterSet(f"gpu-{i}", {"memory-slice-0": 1, "compute-slices": 7}) for i in range(9)]
    consuming = PublishedDevice(
        "m", {}, {}, consumes={"gpu-0": {"memory-slice-0": 1, "compute-slices": 1}}
    )
    slices = resource_slices(
        [consuming], counter_sets=sets, node_name="n", driver=DRIVER, generation=3
    )
    assert [sorted(s["spec"]) for s in slices] == [
        ["driver", "nodeName", "pool", "sharedCounters"],
        ["driver", "nodeName", "pool", "sharedCounters"],
        ["devices", "driver", "nodeName", "pool"],
    ]
    assert [len(s["spec"].get("sharedCounters", ())) for s in slices] == [8, 1, 0]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {3}
    assert slices[0]["spec"]["sharedCounters"][0] == {
        "name": "gpu-0",
        "counters": {"memory-slice-0": {"value": "1"}, "compute-slices": {"value": "7"}},
    }
    assert slices[2]["spec"]["devices"][0]["consumesCounters"] == [
        {
            "counterSet": "gpu-0",
            "counters": {"memory-slice-0": {"value": "1"}, "compute-slices": {"value": "1"}},
        }
    ]


def test_every_published_form_round_trips_through_json() -> None:
    inventory = node(gpu(0))
    (shared,) = published(
        (time_slicing({"name": "gpu", "replicas": 4}), inventory), CAPACITY
    ).values()
    tainted = PublishedDevice(
        "x",
        {"index": {"int": 1}},
        {"memory": Capacity("1Gi")},
        consumes={"gpu-0": {"memory-slice-3": 1}},
        taints=(DeviceTaint("a/b", "c"),),
    )
    for device in (shared, tainted):
        assert PublishedDevice.from_json(device.to_json()) == device
    # A checkpoint written before request policies held each capacity as its quantity.
    old = {"name": "o", "attributes": {}, "capacity": {"memory": "80Gi"}}
    assert PublishedDevice.from_json(old).capacity == {"memory": Capacity("80Gi")}


def slice_devices(docs: list[dict[str, Any]]) -> list[str]:
    return [
        d["name"] for doc in docs if doc["kind"] == "ResourceSlice" for d in doc["spec"]["devices"]
    ]


def test_dra_documents_publish_by_capacity_in_v1_and_by_replica_in_v1beta1() -> None:
    inventory = node(gpu(0))
    cfg = time_slicing({"name": "gpu", "replicas": 2})
    node_plan = plan_node(cfg, inventory, as_is=True)
    v1 = dra_documents(cfg, node_plan, "n", DRIVER, api_version=V1)
    v1beta1 = dra_documents(cfg, node_plan, "n", DRIVER, api_version=V1BETA1)
    assert slice_devices(v1) == [GPU0]
    assert slice_devices(v1beta1) == [f"{GPU0}-r0", f"{GPU0}-r1"]
    by_replica = config(
        dra={"sharedDevices": "replicas"},
        sharing={"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2}]}},
    )
    docs = dra_documents(by_replica, plan_node(by_replica, inventory, as_is=True), "n", DRIVER)
    assert slice_devices(docs) == [f"{GPU0}-r0", f"{GPU0}-r1"]


def test_api_memory_quantities_in_mib() -> None:
    assert quantity_mib("20Gi") == 20480
    assert quantity_mib("27306Mi") == 27306
    assert quantity_mib(str(20 * 1024**3)) == 20480  # bytes, as the API may write them
    assert quantity_mib("1.5Gi") == 1536
    assert quantity_mib("16G") == 15258
    assert quantity_mib("lots") is None and quantity_mib("") is None


def test_the_features_a_server_did_not_keep_are_named() -> None:
    inventory = node(gpu(0))
    shared = published((time_slicing({"name": "gpu", "replicas": 2}), inventory), CAPACITY)
    device = next(iter(shared.values()))
    tainted = PublishedDevice(
        "t", {}, {}, consumes={"gpu-0": {"memory-slice-0": 1}}, taints=(DeviceTaint("k", "v"),)
    )
    (sent,) = resource_slices([device, tainted], node_name="n", driver=DRIVER, generation=1)
    assert dropped_features(sent, sent) == frozenset()
    stored = json.loads(json.dumps(sent))
    for d in stored["spec"]["devices"]:
        d.pop("allowMultipleAllocations", None)
        d.pop("taints", None)
        for c in d["capacity"].values():
            c.pop("requestPolicy", None)
    assert dropped_features(sent, stored) == {"DRAConsumableCapacity", "DRADeviceTaints"}
    stored["spec"]["devices"][1].pop("consumesCounters")
    assert "DRAPartitionableDevices" in dropped_features(sent, stored)
