"""A GPU's architecture from its CUDA compute capability, named as NVIDIA's tools name it.

NVML answers the architecture itself (nvmlDeviceGetArchitecture, R470 and later); a driver that
does not, and the simulator, name it from the compute capability, which fixes it: every
architecture has its own major versions (Volta and Turing share 7, Ampere and Ada Lovelace 8).
The names are those of NVIDIA's device library (go-nvlib's `GetArchitectureAsString`), which
NVIDIA's DRA driver publishes, so selectors written for one match the other.
"""

from __future__ import annotations

from typing import Final

KEPLER: Final = "Kepler"
MAXWELL: Final = "Maxwell"
PASCAL: Final = "Pascal"
VOLTA: Final = "Volta"
TURING: Final = "Turing"
AMPERE: Final = "Ampere"
ADA: Final = "Ada Lovelace"
HOPPER: Final = "Hopper"
BLACKWELL: Final = "Blackwell"

_BY_MAJOR: Final = {3: KEPLER, 5: MAXWELL, 6: PASCAL, 9: HOPPER, 10: BLACKWELL, 12: BLACKWELL}


def architecture_of(compute_capability: tuple[int, int]) -> str:
    """The architecture of a compute capability; "" for one no architecture has."""
    major, minor = compute_capability
    if major == 7:
        return TURING if minor >= 5 else VOLTA
    if major == 8:
        return ADA if minor >= 9 else AMPERE
    return _BY_MAJOR.get(major, "")
