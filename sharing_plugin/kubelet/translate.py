"""The plan's values <-> kubelet's protobuf messages, and nothing else.

The core speaks frozen dataclasses; kubelet speaks `deviceplugin/v1beta1`. Keeping every
conversion here means the servicer never builds a message field by field and the core never sees
generated code. `device_key` is what decides whether kubelet must be told about a change: only
the ID, the health string and the NUMA node reach kubelet, so only they count.
"""

from __future__ import annotations

from collections.abc import Iterable

from sharing_plugin.kubelet.api.deviceplugin.v1beta1 import api_pb2 as dp
from sharing_plugin.plan import ContainerAllocation, ResourcePlan, VirtualDevice

DeviceKey = tuple[tuple[str, str, int | None], ...]


def device_key(resource: ResourcePlan) -> DeviceKey:
    """What kubelet would see of `resource`: (id, health, numa) per device, in order."""
    return tuple((str(d.id), d.health.value, d.numa) for d in resource.devices)


def device_message(device: VirtualDevice) -> dp.Device:
    # Kubelet's topology manager reads NUMA affinity from here; a device without a known NUMA
    # node gets no topology at all (an empty TopologyInfo would claim "no node").
    if device.numa is None:
        return dp.Device(ID=device.id, health=device.health.value)
    return dp.Device(
        ID=device.id,
        health=device.health.value,
        topology=dp.TopologyInfo(nodes=[dp.NUMANode(ID=device.numa)]),
    )


def list_response(devices: Iterable[VirtualDevice]) -> dp.ListAndWatchResponse:
    """One full ListAndWatch message: kubelet replaces its whole device set with each one."""
    return dp.ListAndWatchResponse(devices=[device_message(d) for d in devices])


def container_response(allocation: ContainerAllocation) -> dp.ContainerAllocateResponse:
    """The Allocate answer for one container, field for field."""
    return dp.ContainerAllocateResponse(
        envs=dict(allocation.envs),
        mounts=[
            dp.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in allocation.mounts
        ],
        devices=[
            dp.DeviceSpec(
                container_path=s.container_path, host_path=s.host_path, permissions=s.permissions
            )
            for s in allocation.devices
        ],
        annotations=dict(allocation.annotations),
        cdi_devices=[dp.CDIDevice(name=n) for n in allocation.cdi_devices],
    )
