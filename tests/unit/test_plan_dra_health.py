"""GPU health as DRA shows it: taints in the pool."""

from __future__ import annotations

from plan_factory import config, gpu, gpu_uuid, mig_uuid, node, time_slicing

from sharing_plugin.gpus.health_tracker import Cause, Fault
from sharing_plugin.plan import plan
from sharing_plugin.views.dra import dra_devices, pool_devices
from sharing_plugin.views.dra_api import V1, DeviceTaint, resource_slices
from sharing_plugin.views.dra_health import health_taints, taint_key

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
