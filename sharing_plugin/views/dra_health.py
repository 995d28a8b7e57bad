"""GPU health as DRA shows it: device taints in the pool.

An Unhealthy GPU (or MIG device) stays in the node's pool with a `NoSchedule` taint whose key
is under the driver's domain (`<driver>/unhealthy`) and whose value is the fault's short reason
as a label value (`xid-79`, `ecc-double`, `lost`): the scheduler allocates it to no new claim
that does not tolerate the taint, claims already allocated keep it, and anyone reading the
slice sees why. A GPU's taint also covers every device it backs (its MIG devices, its shares).
Recovery removes the taint. A server without device taints gets no taints, and the pool leaves
Unhealthy devices out instead (the pool's rule).

Everything here is pure.
"""

from __future__ import annotations

from collections.abc import Mapping

from sharing_plugin.gpus.health_tracker import Fault
from sharing_plugin.views.dra_api import DeviceTaint, label_value

UNHEALTHY_TAINT = "unhealthy"


def taint_key(driver: str) -> str:
    """The key of the taint on an Unhealthy device: `<driver>/unhealthy`."""
    return f"{driver}/{UNHEALTHY_TAINT}"


def health_taints(faults: Mapping[str, Fault], driver: str) -> dict[str, DeviceTaint]:
    """GPU or MIG UUID -> the taint of its devices, for every faulty one."""
    key = taint_key(driver)
    return {uuid: DeviceTaint(key, label_value(fault.reason)) for uuid, fault in faults.items()}
