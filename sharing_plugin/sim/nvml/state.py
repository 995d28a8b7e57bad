"""The state of a simulated node's GPUs and the MIG rules the hardware enforces on it.

These objects double as the NVML handles the simulated pynvml hands out (device, GPU-instance and
compute-instance handles are opaque to callers, so the state object itself is the handle). Every
rule violation raises `pynvml.NVMLError` with the code the real driver returns, so code written
against NVML sees the same failures here.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import pynvml

from sharing_plugin.gpus.catalog import GpuModel, MigModel, MigProfileSpec, model_for
from sharing_plugin.sim.nvml.node import LoadedNode, parse_instance

# uuid5 namespace for simulated devices: fixed, so the same description gives the same UUIDs.
_NAMESPACE = uuid.UUID("6f1c3a52-8d0e-4e59-9a3b-2a7c9f1d5e10")
NO_ID = 0xFFFFFFFF  # NVML's "not attributable" GPU/compute-instance id in event data

# NVLink links per GPU (A100: 12, Hopper: 18); any other product linked by `nvlink: all` gets 4.
_NVLINKS = {"A100": 12, "H100": 18, "H200": 18, "A30": 4}
_UNKNOWN_MEMORY_MIB = 16384
_INVALID_ARGUMENT: int = pynvml.NVML_ERROR_INVALID_ARGUMENT
_NO_ROOM: int = pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES


def nvml_error(code: int) -> pynvml.NVMLError:
    """The pynvml exception subclass for an NVML return code, as the real bindings raise it."""
    return pynvml.NVMLError(code)


@dataclass(eq=False)
class SimComputeInstance:
    """A compute instance; also serves as the MIG device handle for it."""

    gpu_instance: SimGpuInstance
    id: int
    profile_id: int  # NVML_COMPUTE_INSTANCE_PROFILE_* (its profile info id equals the index here)
    slices: int
    start: int
    uuid: str


@dataclass(eq=False)
class SimGpuInstance:
    """A GPU instance: a profile at a placement on one GPU."""

    gpu: SimGpu
    id: int
    spec: MigProfileSpec
    start: int
    compute_instances: list[SimComputeInstance] = field(default_factory=list)


@dataclass(eq=False)
class SimGpu:
    """One simulated physical GPU."""

    index: int
    uuid: str
    product: str
    model: GpuModel | None
    memory_mib: int
    numa_node: int | None
    pci_bus_id: str
    pcie_root: str | None = None
    mig_current: bool = False
    mig_pending: bool = False
    lost: bool = False
    gpu_instances: list[SimGpuInstance] = field(default_factory=list)
    nvlink_peers: list[int | None] = field(default_factory=list)  # per link: peer GPU index

    @property
    def mig(self) -> MigModel | None:
        return self.model.mig if self.model is not None else None

    def check_alive(self) -> None:
        if self.lost:
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)

    def mig_devices(self) -> list[SimComputeInstance]:
        """Every compute instance, in the order NVML's MIG device handle indexes walk them."""
        return [
            ci
            for gi in sorted(self.gpu_instances, key=lambda g: g.id)
            for ci in sorted(gi.compute_instances, key=lambda c: c.id)
        ]


def placement_problem(
    gpu: SimGpu, spec: MigProfileSpec, start: int, *, existing: list[tuple[MigProfileSpec, int]]
) -> int | None:
    """The NVML error code creating `spec` at `start` next to `existing` gets; None if it fits.

    A start outside the profile's placement table is an invalid argument (the placement does not
    exist for that profile); everything that is merely occupied or used up is
    NVML_ERROR_INSUFFICIENT_RESOURCES, which is what the driver answers when the GPU has no room.
    """
    mig = gpu.mig
    assert mig is not None
    if start not in spec.starts:
        return _INVALID_ARGUMENT
    if len(existing) >= mig.max_instances:
        return _NO_ROOM
    if sum(1 for s, _ in existing if s.gi_profile_id == spec.gi_profile_id) >= spec.max_count:
        return _NO_ROOM
    if spec.media_extensions and any(s.media_extensions for s, _ in existing):
        return _NO_ROOM
    end = start + spec.memory_slices
    for other, other_start in existing:
        if start < other_start + other.memory_slices and other_start < end:
            return _NO_ROOM
    return None


def arrange(
    gpu: SimGpu, wanted: list[tuple[MigProfileSpec, int | None]]
) -> list[tuple[MigProfileSpec, int]] | None:
    """Starts for every wanted instance so that all of them fit together, or None.

    A small depth-first search over each profile's placement table (at most 7 instances with at
    most 7 starts each); instances with a fixed start are placed first, then the largest ones.
    """
    order = sorted(
        range(len(wanted)),
        key=lambda i: (wanted[i][1] is None, -wanted[i][0].memory_slices, i),
    )
    chosen: dict[int, int] = {}

    def place(k: int, existing: list[tuple[MigProfileSpec, int]]) -> bool:
        if k == len(order):
            return True
        i = order[k]
        spec, fixed = wanted[i]
        for start in (fixed,) if fixed is not None else spec.starts:
            if placement_problem(gpu, spec, start, existing=existing) is None:
                chosen[i] = start
                if place(k + 1, [*existing, (spec, start)]):
                    return True
        return False

    if not place(0, []):
        return None
    return [(spec, chosen[i]) for i, (spec, _) in enumerate(wanted)]


def mig_uuid(gpu: SimGpu, gi: SimGpuInstance, ci_id: int) -> str:
    """Deterministic MIG UUID: the same instance at the same place keeps its UUID across runs."""
    key = f"{gpu.uuid}/{gi.id}/{ci_id}/{gi.spec.name}/{gi.start}"
    return f"MIG-{uuid.uuid5(_NAMESPACE, key)}"


def add_gpu_instance(gpu: SimGpu, spec: MigProfileSpec, start: int) -> SimGpuInstance:
    """Record a GPU instance (rules already checked) under the smallest free GI id."""
    used = {gi.id for gi in gpu.gpu_instances}
    gi_id = next(i for i in range(1, 64) if i not in used)
    gi = SimGpuInstance(gpu=gpu, id=gi_id, spec=spec, start=start)
    gpu.gpu_instances.append(gi)
    return gi


def add_compute_instance(gi: SimGpuInstance, profile_id: int, slices: int) -> SimComputeInstance:
    """Record a compute instance inside `gi` (capacity already checked)."""
    used = {ci.id for ci in gi.compute_instances}
    ci_id = next(i for i in range(64) if i not in used)
    start = sum(ci.slices for ci in gi.compute_instances)
    ci = SimComputeInstance(
        gpu_instance=gi,
        id=ci_id,
        profile_id=profile_id,
        slices=slices,
        start=start,
        uuid=mig_uuid(gi.gpu, gi, ci_id),
    )
    gi.compute_instances.append(ci)
    return ci


def build_gpus(node: LoadedNode) -> tuple[list[SimGpu], list[str]]:
    """The GPUs a node description declares, in their initial MIG state, plus warnings.

    Raises ValueError naming the GPU when its `instances` cannot exist on it.
    """
    gpus: list[SimGpu] = []
    warnings: list[str] = []
    for group_index, group in enumerate(node.description.gpus):
        model = model_for(group.product)
        if model is None:
            warnings.append(
                f"gpus[{group_index}]: product '{group.product}' is not in the catalog: "
                f"simulated without MIG and with {_UNKNOWN_MEMORY_MIB} MiB of memory"
            )
        for position in range(group.count):
            index = len(gpus)
            gpu = SimGpu(
                index=index,
                uuid=f"GPU-{uuid.uuid5(_NAMESPACE, f'{node.identity}/{index}/{group.product}')}",
                product=group.product,
                model=model,
                memory_mib=model.memory_mib if model is not None else _UNKNOWN_MEMORY_MIB,
                numa_node=group.numa_node,
                pci_bus_id=_bus_id(group.pci_bus_ids, position, index),
                pcie_root=group.pcie_root,
            )
            if group.mig is not None:
                _apply_initial_mig(gpu, group.mig.enabled, group.mig.instances, group_index)
            gpus.append(gpu)
    if node.description.nvlink == "all":
        _link_all(gpus)
    return gpus, warnings


def _bus_id(described: tuple[str, ...], position: int, index: int) -> str:
    """A GPU's bus ID in NVML's form (an 8-digit domain, upper case): as described, else spread
    over the PCI buses as a server would."""
    if not described:
        return f"00000000:{(0x07 + 0x10 * index) & 0xFF:02X}:00.0"
    bus = described[position].upper()
    return bus if len(bus) == 16 else f"0000{bus}"


def _apply_initial_mig(
    gpu: SimGpu, enabled: bool, instances: tuple[str, ...], group_index: int
) -> None:
    where = f"gpus[{group_index}] (GPU {gpu.index}, {gpu.product})"
    mig = gpu.mig
    if mig is None:
        if enabled or instances:
            raise ValueError(f"{where}: this product does not support MIG; remove 'mig'")
        return
    if instances and not enabled:
        raise ValueError(f"{where}: 'mig.instances' needs 'mig.enabled: true'")
    gpu.mig_current = gpu.mig_pending = enabled
    wanted: list[tuple[MigProfileSpec, int | None]] = []
    for text in instances:
        name, start = parse_instance(text)
        spec = mig.profile(name)
        if spec is None:
            raise ValueError(
                f"{where}: unknown MIG profile '{name}'; this model has "
                f"{', '.join(mig.profile_names)}"
            )
        wanted.append((spec, start))
    placed = arrange(gpu, wanted)
    if placed is None:
        raise ValueError(
            f"{where}: MIG instances {list(instances)} do not fit together on this GPU "
            "(no arrangement of the model's placements holds them all)"
        )
    for spec, start in placed:
        gi = add_gpu_instance(gpu, spec, start)
        add_compute_instance(gi, spec.ci_profile_id, spec.compute_slices)


def _link_all(gpus: list[SimGpu]) -> None:
    """Direct NVLinks between every pair of same-product GPUs, links spread evenly over peers."""
    for gpu in gpus:
        peers = [g.index for g in gpus if g.product == gpu.product and g is not gpu]
        if not peers:
            continue
        links = next((n for key, n in _NVLINKS.items() if key in gpu.product), 4)
        per_peer = max(1, links // len(peers))
        gpu.nvlink_peers = [
            peers[link // per_peer] if link // per_peer < len(peers) else None
            for link in range(min(max(links, per_peer * len(peers)), pynvml.NVML_NVLINK_MAX_LINKS))
        ]
