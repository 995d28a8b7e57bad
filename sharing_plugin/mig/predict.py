"""The node as it will be once declared MIG layouts are applied, for checking a config first.

A config that declares layouts may also select the new MIG devices for sharing; if that part
does not fit the node, the config must be rejected *before* any instance is created or
destroyed. The new devices have no UUIDs yet, so they get placeholders (`MIG-planned-...`) that
never reach kubelet: the prediction is only planned, never advertised.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from sharing_plugin.gpus.catalog import model_for
from sharing_plugin.gpus.inventory import Gpu, Inventory, MigDevice, MigUuid
from sharing_plugin.mig.desired import GpuMigAction

PLANNED_PREFIX = "MIG-planned-"


def is_planned(uuid: str) -> bool:
    """Whether `uuid` is a placeholder for a MIG device that is yet to be created."""
    return uuid.startswith(PLANNED_PREFIX)


def predicted_inventory(inventory: Inventory, actions: Iterable[GpuMigAction]) -> Inventory:
    """`inventory` with each changing GPU's MIG mode and devices as its action leaves them."""
    changed = {a.gpu.uuid: a for a in actions if a.changes}
    if not changed:
        return inventory
    gpus = tuple(_predicted(g, changed[g.uuid]) if g.uuid in changed else g for g in inventory.gpus)
    return replace(inventory, gpus=gpus)


def _predicted(gpu: Gpu, action: GpuMigAction) -> Gpu:
    if not action.enabled:
        return replace(gpu, mig_enabled=False, mig_devices=())
    model = model_for(gpu.product)
    kept = {k.id for k in action.plan.keep} if action.plan is not None else set()
    devices = [m for m in gpu.mig_devices if m.uuid in kept]
    creates = action.plan.create if action.plan is not None else ()
    for create in creates:
        spec = model.mig.profile(create.profile) if model and model.mig else None
        devices.append(
            MigDevice(
                uuid=MigUuid(f"{PLANNED_PREFIX}{gpu.index}-{create.placement.start}"),
                parent_uuid=gpu.uuid,
                parent_index=gpu.index,
                index=0,
                gi_id=0,
                ci_id=0,
                profile=create.profile,
                gi_profile_id=spec.gi_profile_id if spec else 0,
                placement=create.placement,
                memory_mib=spec.memory_mib if spec else 0,
                sm_count=spec.sm_count if spec else 0,
            )
        )
    ordered = sorted(devices, key=lambda m: (m.placement.start, m.profile))
    numbered = tuple(replace(m, index=i) for i, m in enumerate(ordered))
    return replace(gpu, mig_enabled=True, mig_devices=numbered)
