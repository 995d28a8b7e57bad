"""The MIG instances behind a claim's dynamic MIG devices: made at prepare, destroyed at unprepare.

A claim allocated a placement device (`views/dra_mig.py`) gets its GPU instance and compute
instance when it is prepared, through a `Partitioner` the daemon hands in (the NVML side lives in
another adapter). An instance already at exactly that placement is adopted rather than made
again: an earlier run may have made it, or crashed after making it and before recording the
claim. When one placement of a claim cannot be had, the instances this prepare made are
destroyed again, so NVML's refusal fails that claim and leaves the GPU as it was; adopted ones
stay. At unprepare the instance of each of the claim's placement devices is destroyed, found by
its placement from what was published for the claim, so a restart in between changes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from sharing_plugin.errors import AllocationError, NvmlError
from sharing_plugin.gpus.inventory import MigDevice
from sharing_plugin.plan.build import mig_virtual_device
from sharing_plugin.views.dra import DraDevice
from sharing_plugin.views.dra_api import PublishedDevice
from sharing_plugin.views.dra_mig import DynamicPool, Placement, PlacementRef, published_placement

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class MadeInstance:
    """A placement's instance: the MIG device, and whether this call created it."""

    device: MigDevice
    created: bool


@dataclass(frozen=True, slots=True)
class ClaimDevice:
    """A placement device of a claim being prepared: what the claim is given, where its
    instance is, and whether this prepare created it."""

    device: DraDevice
    placement: Placement
    created: bool


class Partitioner(Protocol):
    """Creates and destroys MIG instances on the node's dynamic GPUs (NVML, through the daemon).

    Both raise `NvmlError` with NVML's reason; `destroy` of a placement with no instance does
    nothing."""

    async def create(self, placement: Placement) -> MadeInstance: ...

    async def destroy(self, where: PlacementRef) -> None: ...


class ClaimInstances:
    """The instances of claims' placement devices, through `partitioner` (None: no dynamic MIG
    on this node, and a placement device is refused)."""

    def __init__(self, partitioner: Partitioner | None) -> None:
        self._partitioner = partitioner

    async def make(
        self, pool: DynamicPool, names: Sequence[str], claim: str, *, tainted: bool = False
    ) -> dict[str, ClaimDevice]:
        """Each placement device among `names` with its instance made or adopted, by name.
        Raises AllocationError with NVML's reason, having destroyed what it created.

        `tainted`: Unhealthy placements are published tainted (the server keeps taints), so a
        claim allocated one tolerates the taint or was allocated before it: it is prepared, as
        any other tainted device; else an Unhealthy placement is refused."""
        made: dict[str, ClaimDevice] = {}
        for name in names:
            placement = pool.placement(name)
            if placement is None:
                continue
            try:
                if not pool.healthy(name) and not tainted:
                    raise AllocationError(
                        f"ResourceClaim {claim}: device {name} ({placement} on GPU "
                        f"{placement.gpu.index}) is unhealthy"
                    )
                if self._partitioner is None:
                    raise AllocationError(
                        f"ResourceClaim {claim}: device {name} is a dynamic MIG placement, "
                        "which this plugin cannot create"
                    )
                try:
                    instance = await self._partitioner.create(placement)
                except NvmlError as exc:
                    raise AllocationError(
                        f"ResourceClaim {claim}: creating MIG instance {placement} on GPU "
                        f"{placement.gpu.index} for device {name}: {exc}"
                    ) from exc
            except AllocationError:
                await self.undo(made)
                raise
            made[name] = ClaimDevice(
                _given(placement, instance.device), placement, instance.created
            )
            log.info(
                "ResourceClaim %s: %s MIG instance %s (%s) on GPU %d",
                claim,
                "created" if instance.created else "adopted",
                placement,
                instance.device.uuid,
                placement.gpu.index,
            )
        return made

    async def undo(self, made: Mapping[str, ClaimDevice]) -> None:
        """Destroy the instances `make` created (a prepare that failed after it)."""
        if self._partitioner is None:
            return
        for made_here in made.values():
            if not made_here.created:
                continue
            try:
                await self._partitioner.destroy(made_here.placement.ref)
            except NvmlError as exc:  # the claim's own error says why the prepare failed
                log.error("giving back MIG instance %s: %s", made_here.placement, exc)

    async def release(self, published: Sequence[PublishedDevice], claim: str) -> None:
        """Destroy the instances of the claim's placement devices. Raises NvmlError
        (NVML_ERROR_IN_USE while a process still runs on one): the claim stays prepared, and
        the kubelet retries."""
        for device in published:
            where = published_placement(device)
            if where is None:
                continue
            if self._partitioner is None:
                raise NvmlError(f"ResourceClaim {claim}: cannot destroy MIG instance {where}")
            await self._partitioner.destroy(where)
            log.info("ResourceClaim %s: destroyed MIG instance %s", claim, where)


def _given(placement: Placement, mig: MigDevice) -> DraDevice:
    """The device a claim is given once `mig`, its placement's instance, exists: the MIG device
    as the device plugin would advertise it, so its CDI edits are Allocate's for it."""
    return DraDevice(
        name=placement.name,
        resource=placement.resource,
        sharing="none",
        device=mig_virtual_device(placement.gpu, mig),
        facts=placement.facts,
        gpu_index=placement.gpu.index,
        mig_profile=placement.spec.name,
        memory_mib=mig.memory_mib or placement.spec.memory_mib,
    )
