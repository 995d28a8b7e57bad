"""What a simulated GPU says it is beyond its name: architecture, brand, and where it sits.

The architecture follows from the catalogued model's compute capability (the values are
pynvml's own constants); every simulated GPU is a datacenter GPU, which current drivers brand
`NVIDIA`. A real node's root complexes are read from sysfs, which has no entries for pretend
GPUs: the simulator names them itself, as its node description places them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sharing_plugin.gpus.catalog import architecture_of
from sharing_plugin.gpus.catalog.architecture import (
    ADA,
    AMPERE,
    BLACKWELL,
    HOPPER,
    KEPLER,
    MAXWELL,
    PASCAL,
    TURING,
    VOLTA,
)
from sharing_plugin.sim.nvml.state import SimGpu

# nvmlDeviceArchitecture_t values: the numbers, not pynvml's names, which older bindings lack
# (nvidia-ml-py 12.550 has no BLACKWELL).
_ARCHITECTURES = {
    KEPLER: 2,
    MAXWELL: 3,
    PASCAL: 4,
    VOLTA: 5,
    TURING: 6,
    AMPERE: 7,
    ADA: 8,
    HOPPER: 9,
    BLACKWELL: 10,
}
ARCH_UNKNOWN = 0xFFFFFFFF  # NVML_DEVICE_ARCH_UNKNOWN
BRAND_NVIDIA = 14  # NVML_BRAND_NVIDIA
# What the simulator reports for a product it does not know (its compute capability too).
UNKNOWN_COMPUTE_CAPABILITY = (7, 0)


def compute_capability(gpu: SimGpu) -> tuple[int, int]:
    return gpu.model.compute_capability if gpu.model is not None else UNKNOWN_COMPUTE_CAPABILITY


class SimIdentity:
    """The identity functions of the simulated pynvml over `gpus`."""

    gpus: list[SimGpu]

    if TYPE_CHECKING:

        def _gpu(self, handle: object) -> SimGpu: ...

    def nvmlDeviceGetArchitecture(self, handle: object) -> int:
        name = architecture_of(compute_capability(self._gpu(handle)))
        return _ARCHITECTURES.get(name, ARCH_UNKNOWN)

    def nvmlDeviceGetBrand(self, handle: object) -> int:
        self._gpu(handle)
        return BRAND_NVIDIA

    def pcie_root(self, bus_id: str) -> str | None:
        """The root complex a GPU at `bus_id` (extended BDF, `0000:07:00.0`) is described
        under; None for one the node does not place."""
        wanted = bus_id.lower()
        for gpu in self.gpus:
            if gpu.pci_bus_id.lower().removeprefix("0000") == wanted:
                return gpu.pcie_root
        return None
