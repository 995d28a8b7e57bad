"""GPU health as DRA shows it: taints in the pool, per-device health for the kubelet."""

from __future__ import annotations

from plan_factory import config, gpu, gpu_uuid, mig_uuid, node, time_slicing

from sharing_plugin.config.base import SharedDevices
from sharing_plugin.gpus.health_tracker import Cause, Fault
from sharing_plugin.plan import plan
from sharing_plugin.views.dra import dra_devices, pool_devices
from sharing_plugin.views.dra_api import V1, DeviceTaint, resource_slices
from sharing_plugin.views.dra_health import DeviceHealth, device_health, health_taints, taint_key

DRIVER = "gpu.sharing-plugin.io"
XID_79 = Fault(Cause.XID, 79, "Xid 79")
ECC = Fault(Cause.DOUBLE_BIT_ECC, None, "double-bit ECC error (uncorrectable memory error)")


def test_each_fault_is_a_noschedule_taint_under_the_drivers_domain() -> None:
    lost = Fault(Cause.LOST, None, "NVML_ERROR_GPU_IS_LOST")
    taints = health_taints({"GPU-a": XID_79, "GPU-b": ECC, "MIG-c": lost}, DRIVER)
    assert taint_key(DRIVER) == "gpu.sharing-plugin.io/unhealthy"
    assert taints == {
        "GPU-a": DeviceTaint("gpu.sharing-plugin.io/unhealthy", "xid-79", "NoSchedule"),
        "GPU-b": DeviceTaint("gpu.sharing-plugin.io/unhealthy", "ecc-double", "NoSchedule"),
        "MIG-c": DeviceTaint("gpu.sharing-plugin.io/unhealthy", "lost", "NoSchedule"),
    }
    assert health_taints({}, DRIVER) == {}


def test_a_gpus_taint_covers_its_mig_devices_and_a_mig_devices_own_taint_wins() -> None:
    inventory = node(gpu(0, migs=("3g.40gb", "3g.40gb")), gpu(1, migs=("3g.40gb", "3g.40gb")))
    cfg = config(flags={"migStrategy": "mixed"})
    faults = {gpu_uuid(0): XID_79, mig_uuid(1, 1): Fault(Cause.XID, 94, "Xid 94")}
    sick = plan(cfg, inventory).with_health({u: False for u in faults})
    devices = dra_devices(sick, inventory)
    pool = pool_devices(devices, taints=health_taints(faults, DRIVER))
    tainted = {
        str(d.attributes["uuid"]["string"]): [t.value for t in d.taints] for d in pool if d.taints
    }
    assert tainted == {
        mig_uuid(0, 0): ["xid-79"],
        mig_uuid(0, 1): ["xid-79"],
        mig_uuid(1, 1): ["xid-94"],
    }
    assert len(pool) == 4  # every device stays in the pool
    # Tainted devices limit their slice to 64 devices, as the API server requires.
    (slice_,) = resource_slices(pool, node_name="n", driver=DRIVER, generation=1, api_version=V1)
    assert sum(1 for d in slice_["spec"]["devices"] if "taints" in d) == 3


def test_recovery_removes_the_taint() -> None:
    inventory = node(gpu(0), gpu(1))
    p = plan(time_slicing({"name": "gpu", "replicas": 2}), inventory)
    sick = dra_devices(p.with_health({gpu_uuid(0): False}), inventory)
    well = dra_devices(p.with_health({gpu_uuid(0): True}), inventory)
    taints = health_taints({gpu_uuid(0): XID_79}, DRIVER)
    assert [bool(d.taints) for d in pool_devices(sick, taints=taints)] == [True, False]
    assert [bool(d.taints) for d in pool_devices(well, taints=health_taints({}, DRIVER))] == [
        False,
        False,
    ]


def test_the_kubelet_hears_every_device_and_why_one_is_unhealthy() -> None:
    inventory = node(gpu(0), gpu(1))
    p = plan(time_slicing({"name": "gpu", "replicas": 4}), inventory)
    devices = dra_devices(
        p.with_health({gpu_uuid(1): False}), inventory, shared=SharedDevices.CAPACITY
    )
    reports = device_health(devices, {gpu_uuid(1): XID_79})
    assert reports == (
        DeviceHealth(devices[0].name, True),
        DeviceHealth(devices[1].name, False, f"{gpu_uuid(1)}: Xid 79"),
    )


def test_a_mig_device_is_unhealthy_by_its_gpus_fault_when_it_has_none_of_its_own() -> None:
    inventory = node(gpu(0, migs=("3g.40gb",)))
    p = plan(config(flags={"migStrategy": "mixed"}), inventory)
    devices = dra_devices(p.with_health({gpu_uuid(0): False}), inventory)
    (report,) = device_health(devices, {gpu_uuid(0): ECC})
    assert not report.healthy
    assert report.message == f"{gpu_uuid(0)}: double-bit ECC error (uncorrectable memory error)"


def test_held_devices_the_plan_dropped_are_reported_by_their_own_fault() -> None:
    inventory = node(gpu(0), gpu(1))
    before = pool_devices(dra_devices(plan(config(), inventory), inventory))
    after = dra_devices(plan(config(), node(gpu(0))), node(gpu(0)))
    held = {before[1].name: before[1]}
    assert device_health(after, {}, held=held)[1] == DeviceHealth(before[1].name, True)
    (_, dropped) = device_health(after, {gpu_uuid(1): XID_79}, held=held)
    assert dropped == DeviceHealth(before[1].name, False, f"{gpu_uuid(1)}: Xid 79")


def test_a_message_is_cut_to_what_the_kubelet_keeps() -> None:
    inventory = node(gpu(0))
    devices = dra_devices(plan(config(), inventory).with_health({gpu_uuid(0): False}), inventory)
    (report,) = device_health(devices, {gpu_uuid(0): Fault(Cause.LOST, None, "x" * 5000)})
    assert len(report.message) == 1024
