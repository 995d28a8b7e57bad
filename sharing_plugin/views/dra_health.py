"""GPU health as DRA shows it: device taints in the pool, and each device's health for the kubelet.

An Unhealthy GPU (or MIG device) stays in the node's pool with a `NoSchedule` taint whose key
is under the driver's domain (`<driver>/unhealthy`) and whose value is the fault's short reason
as a label value (`xid-79`, `ecc-double`, `lost`): the scheduler allocates it to no new claim
that does not tolerate the taint, claims already allocated keep it, and anyone reading the
slice sees why. A GPU's taint also covers every device it backs (its MIG devices, its shares).
Recovery removes the taint. A server without device taints gets no taints, and the pool leaves
Unhealthy devices out instead (the pool's rule).

The kubelet hears the same health per device (`NodeWatchResources`): Healthy, or Unhealthy with
the fault in words. Everything here is pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sharing_plugin.gpus.health_tracker import Fault
from sharing_plugin.views.dra import DraDevice
from sharing_plugin.views.dra_api import DeviceTaint, PublishedDevice, taint_value

UNHEALTHY_TAINT = "unhealthy"
DRAINING_TAINT = "draining"
MAX_HEALTH_MESSAGE = 1024  # what the kubelet keeps of a message


def taint_key(driver: str) -> str:
    """The key of the taint on an Unhealthy device: `<driver>/unhealthy`."""
    return f"{driver}/{UNHEALTHY_TAINT}"


def draining_taint(driver: str) -> DeviceTaint:
    """The taint on a shared device the config dropped while claims still hold shares of it:
    its free shares are not allocated to new claims (`<driver>/draining`)."""
    return DeviceTaint(f"{driver}/{DRAINING_TAINT}", "removed-from-config")


def health_taints(faults: Mapping[str, Fault], driver: str) -> dict[str, DeviceTaint]:
    """GPU or MIG UUID -> the taint of its devices, for every faulty one."""
    key = taint_key(driver)
    return {uuid: DeviceTaint(key, taint_value(fault.reason)) for uuid, fault in faults.items()}


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    """One device of the pool as the kubelet hears it: healthy or not, and why not."""

    name: str
    healthy: bool
    message: str = ""


def device_health(
    devices: Iterable[DraDevice],
    faults: Mapping[str, Fault],
    *,
    held: Mapping[str, PublishedDevice] | None = None,
) -> tuple[DeviceHealth, ...]:
    """The health of every device the node serves, then of the held devices the plan dropped
    (by the fault of the device behind them, if any), in name order within each part."""
    reports: dict[str, DeviceHealth] = {}
    for d in sorted(devices, key=lambda d: d.name):
        if d.healthy:
            reports[d.name] = DeviceHealth(d.name, True)
        else:
            why = _why(faults, d.device.physical, d.gpu_uuid)
            reports[d.name] = DeviceHealth(d.name, False, why or f"{d.device.physical}: Unhealthy")
    for name, published in sorted((held or {}).items()):
        if name in reports:
            continue
        why = _why(faults, str(published.attributes.get("uuid", {}).get("string", "")))
        reports[name] = DeviceHealth(name, why is None, why or "")
    return tuple(reports.values())


def _why(faults: Mapping[str, Fault], *uuids: str) -> str | None:
    """`<uuid>: <fault>` of the first of `uuids` that has a fault (a MIG device's own, then its
    GPU's), cut to what the kubelet keeps; None when none has."""
    for uuid in uuids:
        fault = faults.get(uuid)
        if fault is not None:
            return f"{uuid}: {fault.describe()}"[:MAX_HEALTH_MESSAGE]
    return None
