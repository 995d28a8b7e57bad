"""What a GPU is, beyond its name: its architecture, its brand and the PCIe root complex above it.

NVML answers the first two as enum values (nvmlDeviceGetArchitecture, nvmlDeviceGetBrand); they
are named here as NVIDIA's device library names them, which is what NVIDIA's DRA driver
publishes, so one selector fits both drivers. A driver too old to answer the architecture
(before R470) leaves it to the compute capability; a brand it does not answer is left out.

The root complex is not NVML's to say: the kernel's sysfs says it, as the path of the GPU's PCI
device (`/sys/bus/pci/devices/0000:07:00.0` links to `/sys/devices/pci0000:00/.../0000:07:00.0`,
whose first component names the root), which is how Kubernetes' own helper for the standard
`pcieRoot` attribute finds it. A simulated node has no sysfs for its pretend GPUs and says
where they sit itself, through the same one-method protocol.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Final, Protocol, runtime_checkable

from sharing_plugin.gpus.catalog import architecture_of
from sharing_plugin.nvml.api import DeviceHandle, NvmlApi
from sharing_plugin.nvml.calls import is_code, nvml_errors

# nvmlDeviceArchitecture_t values, named as go-nvlib's GetArchitectureAsString names them.
_ARCHITECTURES: Final = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada Lovelace",
    9: "Hopper",
    10: "Blackwell",
}
# nvmlBrandType_t values, named as go-nvlib's GetBrandAsString names them.
_BRANDS: Final = {
    1: "Quadro",
    2: "Tesla",
    3: "NVS",
    4: "Grid",
    5: "GeForce",
    6: "Titan",
    7: "NvidiaVApps",
    8: "NvidiaVPC",
    9: "NvidiaVCS",
    10: "NvidiaVWS",
    11: "NvidiaCloudGaming",
    12: "QuadroRTX",
    13: "NvidiaRTX",
    14: "Nvidia",
    15: "GeForceRTX",
    16: "TitanRTX",
}
_BDF = re.compile(r"([0-9a-f]{4}):([0-9a-f]{2}):([0-9a-f]{2})\.([0-9a-f])")
_ROOT = re.compile(r"pci[0-9a-f]{4}:[0-9a-f]{2}")


def architecture(
    nvml: NvmlApi, handle: DeviceHandle, compute_capability: tuple[int, int], where: str
) -> str:
    """The GPU's architecture; from its compute capability where NVML does not say."""
    value = _answer(
        nvml, nvml.nvmlDeviceGetArchitecture, handle, f"{where}: reading its architecture"
    )
    return _ARCHITECTURES.get(value, "") or architecture_of(compute_capability)


def brand(nvml: NvmlApi, handle: DeviceHandle, where: str) -> str:
    """The GPU's brand; "" where NVML does not say or names one NVIDIA's tools do not."""
    return _BRANDS.get(
        _answer(nvml, nvml.nvmlDeviceGetBrand, handle, f"{where}: reading its brand"), ""
    )


def _answer(
    nvml: NvmlApi, call: Callable[[DeviceHandle], int], handle: DeviceHandle, what: str
) -> int:
    """What `call` answers; -1 where the GPU or its driver has no answer (not an error)."""
    try:
        return int(call(handle))
    except nvml.NVMLError as exc:
        if is_code(exc, nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_FUNCTION_NOT_FOUND):
            return -1
        with nvml_errors(nvml, what):
            raise


@runtime_checkable
class PcieRoots(Protocol):
    """Where the root complex of a GPU's PCI device is named."""

    def pcie_root(self, bus_id: str) -> str | None:
        """The root complex (`pci<domain>:<bus>`) above the device at `bus_id` (extended
        BDF); None where it cannot be told."""
        ...


class SysfsPcieRoots:
    """The root complexes as the kernel's sysfs under `root` shows them."""

    def __init__(self, root: Path = Path("/sys")) -> None:
        self._root = root

    def pcie_root(self, bus_id: str) -> str | None:
        if not _BDF.fullmatch(bus_id):
            return None
        devices = os.path.realpath(self._root / "devices")
        try:
            path = os.path.realpath(self._root / "bus" / "pci" / "devices" / bus_id, strict=True)
        except OSError:
            return None  # no sysfs (a container without it), or no such device
        first = os.path.relpath(path, devices).split(os.sep)[0]
        return first if _ROOT.fullmatch(first) else None


def pcie_roots_for(nvml: NvmlApi) -> PcieRoots:
    """Who names the root complexes of `nvml`'s GPUs: a simulated node itself, else sysfs."""
    return nvml if isinstance(nvml, PcieRoots) else SysfsPcieRoots()
