"""Plan: (config, inventory) -> what each resource advertises, and Allocate answers. Pure."""

from sharing_plugin.plan.allocate import CONTROL_DEVICE_NODES, allocate
from sharing_plugin.plan.build import plan
from sharing_plugin.plan.model import (
    ContainerAllocation,
    DeviceHealth,
    DeviceId,
    DeviceSpec,
    Mount,
    Plan,
    ResourcePlan,
    VirtualDevice,
    physical_of,
    replica_id,
)
from sharing_plugin.plan.preferred import preferred

__all__ = [
    "CONTROL_DEVICE_NODES",
    "ContainerAllocation",
    "DeviceHealth",
    "DeviceId",
    "DeviceSpec",
    "Mount",
    "Plan",
    "ResourcePlan",
    "VirtualDevice",
    "allocate",
    "physical_of",
    "plan",
    "preferred",
    "replica_id",
]
