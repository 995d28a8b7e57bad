"""Facts about GPU models that NVML cannot be asked before the fact: MIG profiles and placements.

Each catalogued model lists its MIG profiles as NVIDIA documents them (profile name, NVML
GPU-instance profile index and id, memory slices, how many may exist, where they may start). The
simulator enforces these rules when creating instances and the MIG solver searches within them,
so a layout is known to fit before anything touches the hardware.
"""

from __future__ import annotations

from sharing_plugin.errors import MigError
from sharing_plugin.gpus.catalog.architecture import architecture_of
from sharing_plugin.gpus.catalog.models import MODELS
from sharing_plugin.gpus.catalog.types import GpuModel, MigModel, MigProfileSpec

__all__ = [
    "MODELS",
    "GpuModel",
    "MigModel",
    "MigProfileSpec",
    "architecture_of",
    "model_for",
    "resolve_profile",
]

_BY_PRODUCT: dict[str, GpuModel] = {p: m for m in MODELS for p in m.products}


def model_for(product: str) -> GpuModel | None:
    """The catalogued model of a GPU from the name NVML reports for it; None when unknown.

    Drivers before R470 report some products without the "NVIDIA " prefix (e.g.
    "A100-SXM4-40GB"), so that spelling resolves too.
    """
    name = product.strip()
    found = _BY_PRODUCT.get(name)
    if found is None and not name.startswith(("NVIDIA ", "Tesla ")):
        found = _BY_PRODUCT.get(f"NVIDIA {name}")
    return found


def resolve_profile(model: GpuModel, name: str) -> MigProfileSpec:
    """The profile `name` means on `model` (names resolve per model: ``1g.10gb`` on an A100-40GB
    is a different profile than on an A100-80GB); raises MigError listing the model's profiles.
    """
    if model.mig is None:
        raise MigError(f"{model.display_name} does not support MIG (profile {name!r} requested)")
    spec = model.mig.profile(name.strip())
    if spec is None:
        known = ", ".join(model.mig.profile_names)
        raise MigError(
            f"unknown MIG profile {name!r} for {model.display_name}: its profiles are {known}"
        )
    return spec
