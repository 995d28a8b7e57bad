"""Dynamic MIG for `run-dra`: the instances of prepared claims, made and destroyed through NVML.

The DRA adapter asks for a placement's instance when a claim allocated it is prepared, and for
its end when the claim is unprepared (`dra/partitions.py`). Here that becomes NVML calls through
the adapter's MIG operations, with the rules the declared layouts follow: a GPU instance is
always created at an explicit placement, with one compute instance spanning it (a GPU instance
left without one is destroyed again: nothing could use it, yet it would hold its slices), and
nothing but the claim's own instance is ever destroyed. MIG mode is the pipeline's MIG step's
(a dynamic entry turns it on; the GPU gets placements once it is on).

NVML calls block, so each runs in a worker thread, and the calls on one GPU are serialised by
a lock of that GPU (claims on other GPUs go on meanwhile). Before creating, the GPU's instances
are read: one already at exactly that placement is adopted, not made again (an earlier run
made it, or crashed before recording its claim). After each change the GPU's MIG devices are
read again and handed to the pipeline, which takes them in turn with its updates, so later plans,
the health watch (an Xid on the new MIG device is attributed to it) and the pool see the GPU as
it is.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from sharing_plugin.daemon.node.mig import make_mig_device, mig_operation
from sharing_plugin.dra.checkpoint import PreparedClaim
from sharing_plugin.dra.partitions import MadeInstance
from sharing_plugin.errors import NvmlError
from sharing_plugin.gpus.holders import Holder
from sharing_plugin.gpus.inventory import Gpu, Inventory, MigDevice
from sharing_plugin.nvml.api import NvmlApi
from sharing_plugin.nvml.discover import read_mig_devices
from sharing_plugin.nvml.mig_ops import (
    destroy_mig_device,
)
from sharing_plugin.observability.metrics import Metrics
from sharing_plugin.views.dra_mig import Placement, PlacementRef, published_placement

log = logging.getLogger(__name__)

_T = TypeVar("_T")


MigDevicesChanged = Callable[[str, tuple[MigDevice, ...]], Awaitable[None]]
"""The GPU of that UUID has these MIG devices now."""


class NodePartitioner:
    """Makes and destroys the MIG instances of claims on the node's dynamic GPUs (the DRA
    adapter's `Partitioner`). `node` is the node's GPUs as last served; `changed` hands a GPU's
    new MIG devices to the pipeline and returns once the pool has been computed on them."""

    def __init__(
        self,
        nvml: NvmlApi,
        *,
        node: Callable[[], Inventory | None],
        changed: MigDevicesChanged,
        metrics: Metrics | None = None,
    ) -> None:
        self._nvml = nvml
        self._node = node
        self._changed = changed
        self._metrics = metrics
        self._locks: dict[str, asyncio.Lock] = {}

    async def create(self, placement: Placement) -> MadeInstance:
        gpu = placement.gpu
        async with self._lock(gpu.uuid):
            made, devices = await asyncio.to_thread(self._create, placement)
            if made.created:
                await self._changed(gpu.uuid, devices)
        return made

    async def destroy(self, where: PlacementRef) -> None:
        inventory = self._node()
        gpu = inventory.gpu(where.gpu_uuid) if inventory is not None else None
        if gpu is None:  # the GPU left the node (and its instances with it)
            log.warning("not destroying MIG instance %s: the GPU is not on this node", where)
            return
        async with self._lock(where.gpu_uuid):
            devices = await asyncio.to_thread(self._destroy, gpu, where)
            if devices is not None:
                await self._changed(gpu.uuid, devices)

    def _lock(self, gpu_uuid: str) -> asyncio.Lock:
        return self._locks.setdefault(gpu_uuid, asyncio.Lock())

    # ---- in the worker thread ----

    def _read(self, gpu: Gpu) -> tuple[MigDevice, ...]:
        return read_mig_devices(self._nvml, gpu.uuid, parent_index=gpu.index, product=gpu.product)

    def _create(self, placement: Placement) -> tuple[MadeInstance, tuple[MigDevice, ...]]:
        gpu, spec = placement.gpu, placement.spec
        devices = self._read(gpu)
        there = _at(devices, placement.ref)
        if there:
            return MadeInstance(there[0], created=False), devices
        created = make_mig_device(self._nvml, self._metrics, gpu, spec, placement.start)
        devices = self._read(gpu)
        mine = next(
            (d for d in devices if (d.gi_id, d.ci_id) == (created.gi_id, created.ci_id)), None
        )
        if mine is None:
            raise NvmlError(
                f"GPU {gpu.index} ({gpu.uuid}): the new MIG device {created.uuid} is not listed"
            )
        log.info("GPU %d (%s): created %s (%s)", gpu.index, gpu.uuid, placement, mine.uuid)
        return MadeInstance(mine, created=True), devices

    def _destroy(self, gpu: Gpu, where: PlacementRef) -> tuple[MigDevice, ...] | None:
        """Destroy the instance at `where` (each of its compute instances, then the GPU
        instance); the GPU's MIG devices afterwards, None when there was none to destroy."""
        found = _at(self._read(gpu), where)
        if not found:
            return None
        if len(found) > 1:
            raise NvmlError(
                f"GPU {gpu.index} ({gpu.uuid}): the GPU instance at {where.profile}@"
                f"{where.start} holds {len(found)} compute instances (made by hand beside the "
                "claim's own): destroy them by hand (nvidia-smi mig -dci, -dgi)"
            )
        gi_id = found[0].gi_id
        self._op(
            "destroy-gpu-instance",
            destroy_mig_device,
            self._nvml,
            gpu.uuid,
            gi_id=gi_id,
            ci_id=found[0].ci_id,
        )
        log.info("GPU %d (%s): destroyed %s@%d", gpu.index, gpu.uuid, where.profile, where.start)
        return self._read(gpu)

    def _op(self, name: str, call: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        return mig_operation(self._metrics, name, call, *args, **kwargs)


def _at(devices: tuple[MigDevice, ...], where: PlacementRef) -> list[MigDevice]:
    """The MIG devices (compute instances) of the GPU instance at exactly `where`."""
    found = [d for d in devices if d.profile == where.profile and d.placement.start == where.start]
    return sorted(found, key=lambda d: d.ci_id)


def claim_holders(prepared: Mapping[str, PreparedClaim], inventory: Inventory) -> dict[str, Holder]:
    """The GPU and MIG UUIDs prepared claims hold, for the declared layouts: a claim's device
    holds its `uuid`, and a dynamic MIG placement the MIG device at that placement now."""
    held: dict[str, Holder] = {}
    for claim in prepared.values():
        holder = Holder(claim.ref.namespace, claim.ref.name, "")
        for device in claim.published:
            where = published_placement(device)
            gpu = inventory.gpu(where.gpu_uuid) if where is not None else None
            if where is not None:
                for mig in _at(gpu.mig_devices if gpu is not None else (), where):
                    held.setdefault(mig.uuid, holder)
                continue
            uuid = device.attributes.get("uuid", {}).get("string")
            if isinstance(uuid, str):
                held.setdefault(uuid, holder)
    return held
