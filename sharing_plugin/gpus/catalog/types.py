"""The shapes of the catalog's facts: GPU models, their MIG geometry and GPU-instance profiles.

NVML can list a GPU's MIG profiles and placements only once MIG mode is on, and only on the GPU
itself; validating a declared layout before touching anything (and simulating GPUs that are not
there) needs the same facts as plain values. These classes hold them; the data lives next door.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class MigProfileSpec:
    """One GPU-instance profile of a model, e.g. ``3g.40gb`` on an A100-80GB.

    Two NVML identifiers exist for a profile and both are needed: the *profile index*
    (``NVML_GPU_INSTANCE_PROFILE_*``, passed to ``nvmlDeviceGetGpuInstanceProfileInfo``) and the
    profile's *id* that call returns in ``nvmlGpuInstanceProfileInfo_t.id`` (what ``nvidia-smi mig
    -lgip`` prints in its ID column, and what ``nvmlDeviceCreateGpuInstanceWithPlacement`` and
    ``nvmlDeviceGetGpuInstancePossiblePlacements_v2`` take).
    """

    name: str  # "1g.10gb", "1g.10gb+me"
    gi_profile_id: (
        int  # NVML_GPU_INSTANCE_PROFILE_* index (e.g. 0 = 1 slice, 7 = 1 slice REV1 "+me")
    )
    ci_profile_id: int  # NVML_COMPUTE_INSTANCE_PROFILE_* of the compute instance spanning the GI
    compute_slices: int  # the "Ng" part
    memory_slices: int  # placement size, in memory slices
    max_count: int  # how many instances of this profile fit on one GPU at most
    starts: tuple[int, ...]  # allowed placement starts, in memory slices
    memory_mib: int
    sm_count: int
    profile_info_id: int  # nvmlGpuInstanceProfileInfo_t.id, the "ID" column of nvidia-smi mig -lgip
    media_extensions: bool = False  # a "+me" profile: holds the GPU's single JPEG/OFA set

    @property
    def size(self) -> int:
        """Placement size in memory slices (NVML's ``nvmlGpuInstancePlacement_t.size``)."""
        return self.memory_slices


@dataclass(frozen=True, slots=True)
class MigModel:
    """The MIG geometry of a model.

    Placement rules, as NVML enforces them: an instance occupies ``memory_slices`` consecutive
    memory slices from one of its profile's ``starts``; instances never overlap; a profile has at
    most ``max_count`` instances; at most one "+me" instance exists per GPU (the GPU has a single
    JPEG/OFA set, MIG user guide "A single 1g profile can include media extensions"); and at most
    ``max_instances`` GPU instances exist in total.
    """

    memory_slices: int  # 8 on A100/H100/H200, 4 on A30
    compute_slices: int  # 7 on A100/H100/H200, 4 on A30
    profiles: tuple[MigProfileSpec, ...]
    max_instances: int = 7  # "Max Number of Instances" in the MIG user guide's Supported GPUs
    _by_name: dict[str, MigProfileSpec] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {p.name: p for p in self.profiles})

    def profile(self, name: str) -> MigProfileSpec | None:
        return self._by_name.get(name)

    def profile_by_id(self, gi_profile_id: int) -> MigProfileSpec | None:
        return next((p for p in self.profiles if p.gi_profile_id == gi_profile_id), None)

    def profile_by_info_id(self, profile_info_id: int) -> MigProfileSpec | None:
        return next((p for p in self.profiles if p.profile_info_id == profile_info_id), None)

    @property
    def profile_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.profiles)


@dataclass(frozen=True, slots=True)
class GpuModel:
    """A GPU model as NVML names it, with what the simulator needs to impersonate it."""

    products: tuple[str, ...]  # every nvmlDeviceGetName string of this model
    memory_mib: int  # nvmlDeviceGetMemoryInfo total, in MiB
    compute_capability: tuple[int, int]
    mig: MigModel | None = None
    name: str = ""  # short name for messages, e.g. "A100-SXM4-40GB"
    sm_count: int = 0  # streaming multiprocessors of the whole GPU (0: not catalogued)

    @property
    def display_name(self) -> str:
        return self.name or self.products[0]
