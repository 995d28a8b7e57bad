"""Facts about GPU models that NVML cannot be asked before the fact: MIG profiles and placements.

Each catalogued model lists its MIG profiles as NVIDIA documents them (profile name, NVML
GPU-instance profile id, memory slices, how many may exist, where they may start). The simulator
enforces these rules when creating instances and the MIG solver searches within them, so a layout
is known to fit before anything touches the hardware.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MigProfileSpec:
    """One GPU-instance profile of a model, e.g. ``3g.40gb`` on an A100-80GB."""

    name: str  # "1g.10gb", "1g.10gb+me"
    gi_profile_id: int  # NVML_GPU_INSTANCE_PROFILE_* (e.g. 0 = 1 slice, 7 = 1 slice REV1 "+me")
    ci_profile_id: int  # NVML_COMPUTE_INSTANCE_PROFILE_* of the compute instance spanning the GI
    compute_slices: int  # the "Ng" part
    memory_slices: int  # placement size, in memory slices
    max_count: int  # how many instances of this profile fit on one GPU at most
    starts: tuple[int, ...]  # allowed placement starts, in memory slices
    memory_mib: int
    sm_count: int


@dataclass(frozen=True, slots=True)
class MigModel:
    """The MIG geometry of a model."""

    memory_slices: int  # 8 on A100/H100/H200, 4 on A30
    compute_slices: int  # 7 on A100/H100/H200, 4 on A30
    profiles: tuple[MigProfileSpec, ...]

    def profile(self, name: str) -> MigProfileSpec | None:
        return next((p for p in self.profiles if p.name == name), None)

    def profile_by_id(self, gi_profile_id: int) -> MigProfileSpec | None:
        return next((p for p in self.profiles if p.gi_profile_id == gi_profile_id), None)


@dataclass(frozen=True, slots=True)
class GpuModel:
    """A GPU model as NVML names it, with what the simulator needs to impersonate it."""

    products: tuple[str, ...]  # every nvmlDeviceGetName string of this model
    memory_mib: int
    compute_capability: tuple[int, int]
    mig: MigModel | None = None
