"""Hand-built inventories and configs for the plan tests: small, explicit, deterministic."""

from __future__ import annotations

from typing import Any

from sharing_plugin.config.model import Config
from sharing_plugin.gpus.inventory import (
    Gpu,
    GpuLink,
    GpuUuid,
    Inventory,
    MigDevice,
    MigPlacement,
    MigUuid,
    Topology,
)

A100 = "NVIDIA A100-SXM4-80GB"
T4 = "Tesla T4"

_PROFILE_SLICES = {"1g.10gb": 1, "1g.10gb+me": 1, "2g.20gb": 2, "3g.40gb": 4, "7g.80gb": 8}


def gpu_uuid(index: int) -> GpuUuid:
    return GpuUuid(f"GPU-{index:08x}-0000-4000-8000-000000000000")


def mig_uuid(gpu: int, j: int) -> MigUuid:
    return MigUuid(f"MIG-{gpu:04x}{j:04x}-0000-4000-8000-000000000000")


def gpu(
    index: int,
    *,
    product: str = A100,
    migs: tuple[str, ...] = (),
    mig_enabled: bool | None = None,
    numa: int | None = 0,
    cc: tuple[int, int] = (8, 0),
    healthy: bool = True,
) -> Gpu:
    """A GPU with index == minor; `migs` lists the profiles of its MIG devices, in order."""
    uuid = gpu_uuid(index)
    devices = []
    start = 0
    for j, profile in enumerate(migs):
        size = _PROFILE_SLICES.get(profile, 1)
        devices.append(
            MigDevice(
                uuid=mig_uuid(index, j),
                parent_uuid=uuid,
                parent_index=index,
                index=j,
                gi_id=j + 1,
                ci_id=0,
                profile=profile,
                gi_profile_id=0,
                placement=MigPlacement(start, size),
                memory_mib=10_000 * size,
            )
        )
        start += size
    return Gpu(
        index=index,
        uuid=uuid,
        product=product,
        memory_mib=81_920,
        minor=index,
        pci_bus_id=f"00000000:{index + 1:02x}:00.0",
        numa_node=numa,
        compute_capability=cc,
        mig_capable=product == A100,
        mig_enabled=bool(migs) if mig_enabled is None else mig_enabled,
        mig_devices=tuple(devices),
        healthy_at_discovery=healthy,
    )


def node(*gpus: Gpu, links: tuple[GpuLink, ...] = ()) -> Inventory:
    return Inventory(gpus=tuple(gpus), links=links)


def nvlinked(*gpus: Gpu, nvlinks: int = 12) -> Inventory:
    indexes = [g.index for g in gpus]
    links = tuple(
        GpuLink(a, b, nvlinks, Topology.NODE)
        for i, a in enumerate(indexes)
        for b in indexes[i + 1 :]
    )
    return Inventory(gpus=tuple(gpus), links=links)


def config(**sections: Any) -> Config:
    """A config from camelCase sections, e.g. config(flags={"migStrategy": "mixed"})."""
    return Config.model_validate({"version": "v1", **sections})


def time_slicing(*resources: dict[str, Any], **options: Any) -> Config:
    return config(sharing={"timeSlicing": {**options, "resources": list(resources)}})


def mps(*resources: dict[str, Any], **options: Any) -> Config:
    return config(sharing={"mps": {**options, "resources": list(resources)}})
