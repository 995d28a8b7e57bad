"""What a device of the pool says it is: its attributes, in the names NVIDIA's tools read.

Beside our own attributes (`resource`, `sharing`, `index`, `migProfile`, `replica`,
`migStart`), every device carries those NVIDIA's DRA driver publishes, with the same names and
value types, so that a selector written for that driver (`architecture == "Hopper"`,
`cudaComputeCapability >= semver("9.0")`) selects here too, and tools that read a slice's
devices (dcgm-exporter's DRA mode reads `type`, `uuid`, `parentUUID`, `profile`) understand
ours: `type` (`gpu` | `mig`), `uuid`, `parentUUID` and `profile` (MIG), `productName`, `brand`,
`architecture`, `pcieBusID`, and three `version` attributes: `cudaComputeCapability` (9.0 ->
`9.0.0`), `driverVersion` and `cudaDriverVersion`. The API wants a version in semantic
versioning 2.0 without leading zeros, so `535.104.05` is published as `535.104.5`, as NVIDIA's
driver does. The standard attributes of Kubernetes follow where NVML and sysfs know them:
`resource.kubernetes.io/pciBusID`, `resource.kubernetes.io/pcieRoot` (what DRA aligns devices
of several drivers on) and `resource.kubernetes.io/numaNode` (an int: Kubernetes 1.37 defines
it as a list, which servers before it refuse; a single value is what both accept).

A device has at most 32 attributes and capacities together (the API server's limit); the most
a device of ours carries is counted in the tests.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from sharing_plugin.gpus.inventory import Gpu, Inventory, extended_bdf
from sharing_plugin.views.dra_api import MAX_STRING_ATTRIBUTE, Attribute

MAX_ATTRIBUTES_AND_CAPACITIES: Final = 32  # ResourceSliceMaxAttributesAndCapacitiesPerDevice
STANDARD: Final = "resource.kubernetes.io/"
PCI_BUS_ID: Final = f"{STANDARD}pciBusID"
PCIE_ROOT: Final = f"{STANDARD}pcieRoot"
NUMA_NODE: Final = f"{STANDARD}numaNode"
GPU_TYPE: Final = "gpu"
MIG_TYPE: Final = "mig"
_VERSION_PART = re.compile(r"\d+")


def semver(text: str) -> str | None:
    """A dotted version (`550.54.15`, `9.0`, `535.104.05`) as the API's `version` attribute
    takes it: three numbers without leading zeros; None for what is not one."""
    parts = text.strip().split(".")
    if not 1 <= len(parts) <= 3 or not all(_VERSION_PART.fullmatch(p) for p in parts):
        return None
    numbers = [int(p) for p in parts] + [0] * (3 - len(parts))
    return ".".join(str(n) for n in numbers)


def cuda_version(encoded: int) -> str | None:
    """nvmlSystemGetCudaDriverVersion's answer (12040) as a version (`12.4.0`)."""
    if encoded <= 0:
        return None
    return f"{encoded // 1000}.{encoded % 1000 // 10}.0"


@dataclass(frozen=True, slots=True)
class GpuFacts:
    """What every device on one GPU says about the GPU (and the node's driver)."""

    product: str
    brand: str = ""
    architecture: str = ""
    compute_capability: str | None = None
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    pci_bus_id: str | None = None
    pcie_root: str | None = None
    numa_node: int | None = None

    def attributes(self) -> dict[str, Attribute]:
        found: dict[str, Attribute] = {
            "productName": {"string": self.product[:MAX_STRING_ATTRIBUTE]}
        }
        for name, text in (("brand", self.brand), ("architecture", self.architecture)):
            if text:
                found[name] = {"string": text[:MAX_STRING_ATTRIBUTE]}
        for name, version in (
            ("cudaComputeCapability", self.compute_capability),
            ("driverVersion", self.driver_version),
            ("cudaDriverVersion", self.cuda_driver_version),
        ):
            if version is not None:
                found[name] = {"version": version}
        if self.pci_bus_id is not None:
            found["pcieBusID"] = {"string": self.pci_bus_id}
            found[PCI_BUS_ID] = {"string": self.pci_bus_id}
        if self.pcie_root is not None:
            found[PCIE_ROOT] = {"string": self.pcie_root}
        if self.numa_node is not None:
            found[NUMA_NODE] = {"int": self.numa_node}
        return found


def gpu_facts(gpu: Gpu | None, inventory: Inventory) -> GpuFacts:
    """The facts of `gpu` on the node of `inventory` (only the driver's for an unknown GPU)."""
    driver = semver(inventory.driver_version)
    cuda = cuda_version(inventory.cuda_driver_version)
    if gpu is None:
        return GpuFacts("", driver_version=driver, cuda_driver_version=cuda)
    major, minor = gpu.compute_capability
    return GpuFacts(
        product=gpu.product,
        brand=gpu.brand,
        architecture=gpu.architecture,
        compute_capability=f"{major}.{minor}.0" if major > 0 else None,
        driver_version=driver,
        cuda_driver_version=cuda,
        pci_bus_id=extended_bdf(gpu.pci_bus_id),
        pcie_root=gpu.pcie_root,
        numa_node=gpu.numa_node,
    )


def device_attributes(
    *,
    resource: str,
    uuid: str,
    facts: GpuFacts,
    sharing: str,
    index: int,
    mig_profile: str | None = None,
    parent_uuid: str | None = None,
) -> dict[str, Attribute]:
    """The attributes every device of the pool carries (docs/contract.md, "Devices"): a MIG
    device's (`mig_profile` given) name its GPU as `parent_uuid`."""
    attributes: dict[str, Attribute] = {
        "type": {"string": MIG_TYPE if mig_profile is not None else GPU_TYPE},
        "resource": {"string": resource},
        "uuid": {"string": uuid},
        **facts.attributes(),
        "sharing": {"string": sharing},
        "index": {"int": index},
    }
    if mig_profile is not None:
        attributes["migProfile"] = {"string": mig_profile}
        attributes["profile"] = {"string": mig_profile}
        if parent_uuid is not None:
            attributes["parentUUID"] = {"string": parent_uuid}
    return attributes
