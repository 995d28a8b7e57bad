"""What `partitioning.mig` asks of each GPU, as values: mode change, MigPlan, or why not (pure).

The daemon applies these actions and `sharing-plugin plan` prints them, so both agree on what
would happen. Everything that can be decided without touching NVML is decided here: which GPUs
an entry selects, whether the layout fits the model's placement table, which current instances
pods hold (those are pinned; a layout that needs them gone is *pending*, naming the pods), and
whether a MIG mode change is already waiting for a GPU reset (pending too: a reset would kill
every process on the GPU, so it is the admin's call, never ours).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Literal

from sharing_plugin.config.model import Config
from sharing_plugin.errors import MigError, Problem
from sharing_plugin.gpus.catalog import model_for, resolve_profile
from sharing_plugin.gpus.holders import Holder
from sharing_plugin.gpus.inventory import Gpu, Inventory
from sharing_plugin.mig.layout import MigInstance, MigPendingError, MigPlan
from sharing_plugin.mig.select import SelectedLayout, entry_path, select_layouts
from sharing_plugin.mig.solver import plan_mig

__all__ = [
    "NOTHING_HELD",
    "RESET_NEEDED",
    "GpuMigAction",
    "MigActions",
    "current_instances",
    "mig_actions",
]


RESET_NEEDED = "MIG mode change needs a GPU reset"
NOTHING_HELD: Mapping[str, Holder] = MappingProxyType({})
ModeChange = Literal["enable", "disable"]


@dataclass(frozen=True, slots=True)
class GpuMigAction:
    """What one GPU needs to match its declared layout.

    Exactly one of: nothing to do (`changes` false), a change to apply (`mode` and/or `plan`),
    `pending` (a pod or a GPU reset must come first), or `error` (the layout cannot be had).
    """

    gpu: Gpu
    entry: int
    enabled: bool  # the MIG mode asked for
    desired: tuple[tuple[str, int], ...]  # canonical profile -> count, by name
    current: tuple[MigInstance, ...]
    mode: ModeChange | None = None
    plan: MigPlan | None = None
    pending: str | None = None
    error: str | None = None
    dynamic: bool = False  # instances are created and destroyed per claim (run-dra)

    @property
    def changes(self) -> bool:
        if self.pending is not None or self.error is not None:
            return False
        return self.mode is not None or (self.plan is not None and self.plan.changes)

    @property
    def state(self) -> str:
        if self.error is not None:
            return "error"
        if self.pending is not None:
            return "pending"
        return "change" if self.changes else "applied"

    def current_layout(self) -> list[str]:
        return [f"{i.profile}@{i.placement.start}" for i in self.current]

    def desired_layout(self) -> list[str]:
        if not self.enabled:
            return []
        if self.dynamic:
            return ["dynamic"]
        if self.plan is not None:
            return [f"{c.profile}@{c.placement.start}" for c in self.plan.layout]
        return [name for name, count in self.desired for _ in range(count)]

    def describe(self) -> list[str]:
        """The actions in the order they are applied (mode on, destroys, creates, mode off)."""
        lines: list[str] = []
        if self.mode == "enable":
            lines.append("enable MIG mode")
        if self.plan is not None:
            lines += [line for line in self.plan.describe() if not line.startswith("keep ")]
        if self.mode == "disable":
            lines.append("disable MIG mode")
        return lines

    def to_json(self) -> dict[str, Any]:
        """One entry of the `plan` command's `mig` list."""
        data: dict[str, Any] = {
            "gpu": self.gpu.uuid,
            "index": self.gpu.index,
            "product": self.gpu.product,
            "entry": entry_path(self.entry),
            "migMode": {"current": self.gpu.mig_enabled, "desired": self.enabled},
            "current": self.current_layout(),
            "desired": self.desired_layout(),
            "actions": self.describe(),
            "state": self.state,
            "reason": self.pending,
            "error": self.error,
        }
        if self.dynamic:
            data["dynamic"] = True
        return data

    def lines(self) -> list[str]:
        """The table form: a heading per GPU, then its actions indented."""
        current = " ".join(self.current_layout()) if self.gpu.mig_enabled else "MIG off"
        desired = " ".join(self.desired_layout()) if self.enabled else "MIG off"
        head = f"GPU {self.gpu.index} ({self.gpu.product}): {current or 'empty'} -> "
        out = [head + (desired or "empty")]
        if self.error is not None:
            return [*out, f"  error: {self.error}"]
        if self.pending is not None:
            return [*out, f"  pending: {self.pending}"]
        return out + [f"  {line}" for line in self.describe()] if self.changes else out


@dataclass(frozen=True, slots=True)
class MigActions:
    """Per selected GPU its action, and every problem (selection errors, impossible layouts)."""

    actions: tuple[GpuMigAction, ...]
    problems: tuple[Problem, ...]


def current_instances(gpu: Gpu) -> tuple[MigInstance, ...]:
    """The GPU's GPU instances, each named by the MIG UUID of its first compute instance.

    Discovery reports one MIG device per compute instance; a GPU instance someone split into
    several compute instances shows up several times with one placement, and is one instance
    to the solver.
    """
    seen: dict[int, MigInstance] = {}
    for mig in sorted(gpu.mig_devices, key=lambda m: (m.gi_id, m.ci_id)):
        seen.setdefault(mig.gi_id, MigInstance(mig.uuid, mig.profile, mig.placement))
    return tuple(sorted(seen.values(), key=lambda i: (i.placement.start, i.profile)))


def _holders(gpu: Gpu, held: Mapping[str, Holder]) -> dict[str, tuple[str, Holder]]:
    """Instance id (or the GPU's UUID) -> (the held device's UUID, who holds it)."""
    instance_of: dict[str, int] = {m.uuid: m.gi_id for m in gpu.mig_devices}
    id_of_gi = {
        m.gi_id: i.id for i in current_instances(gpu) for m in gpu.mig_devices if m.uuid == i.id
    }
    found: dict[str, tuple[str, Holder]] = {}
    for device, holder in sorted(held.items()):
        physical = device.split("::", 1)[0]
        if physical == gpu.uuid:
            found.setdefault(gpu.uuid, (physical, holder))
        elif physical in instance_of:
            found.setdefault(id_of_gi[instance_of[physical]], (physical, holder))
    return found


def _waiting(names: list[tuple[str, Holder]], what: str) -> str:
    # PodResources names a pod's container; DRA holders are ResourceClaims (no container).
    parts = [
        f"waiting for {'pod' if h.container else 'ResourceClaim'} {h.namespace}/{h.pod} "
        f"to release {uuid}"
        for uuid, h in names
    ]
    return "; ".join(parts) + what


def _action(selected: SelectedLayout, held: Mapping[str, Holder]) -> GpuMigAction:
    gpu, layout = selected.gpu, selected.layout
    base = GpuMigAction(
        gpu=gpu,
        entry=selected.entry,
        enabled=layout.enabled,
        desired=tuple(sorted(layout.profiles.items())),
        current=current_instances(gpu) if gpu.mig_enabled else (),
    )

    def with_(**changes: Any) -> GpuMigAction:
        return replace(base, **changes)

    model = model_for(gpu.product)
    if not layout.enabled and not gpu.mig_enabled and not gpu.mig_pending:
        return base  # MIG off and to stay off: nothing to know about the model
    if model is None or model.mig is None:
        if not gpu.mig_capable:
            return with_(error=f"{gpu.product} does not support MIG: leave this GPU out")
        return with_(
            error=f"{gpu.product} is not in the MIG catalog, so its placement rules are "
            "unknown and its layout cannot be checked: partition it by hand"
        )
    try:
        desired = {resolve_profile(model, n).name: c for n, c in layout.profiles.items()}
    except MigError as exc:
        return with_(error=str(exc))
    base = with_(desired=tuple(sorted(desired.items())))
    holders = _holders(gpu, held)
    if gpu.mig_enabled != layout.enabled and gpu.mig_pending == layout.enabled:
        return with_(
            pending=f"{RESET_NEEDED} (MIG mode is set to turn "
            f"{'on' if layout.enabled else 'off'} at the next reset)"
        )
    if layout.dynamic:
        return _dynamic(base, holders)
    if not layout.enabled:
        # The driver refuses to leave MIG mode while GPU instances exist: all of them go first.
        busy = [holders[i.id] for i in base.current if i.id in holders]
        if busy:
            return with_(pending=_waiting(busy, " before MIG mode can be turned off"))
        plan = MigPlan(keep=(), destroy=base.current, create=())
        return with_(plan=plan, mode="disable" if gpu.mig_pending else None)
    if not gpu.mig_enabled and gpu.uuid in holders:
        # Enabling MIG mode on a GPU a process uses fails with NVML_ERROR_IN_USE.
        return with_(pending=_waiting([holders[gpu.uuid]], " before MIG mode can be turned on"))
    try:
        plan = plan_mig(model, current=base.current, desired=desired, held=set(holders))
    except MigPendingError as exc:
        busy = [holders[i.id] for i in exc.blocking if i.id in holders]
        return with_(pending=_waiting(busy, ", whose place the new layout needs"))
    except MigError as exc:
        return with_(error=str(exc))
    return with_(plan=plan, mode=None if gpu.mig_pending else "enable")


def _dynamic(base: GpuMigAction, holders: Mapping[str, tuple[str, Holder]]) -> GpuMigAction:
    """A dynamic GPU: MIG mode on, and its instances are the claims' (created when a claim is
    prepared, destroyed when it is unprepared), so nothing is created or destroyed here."""
    gpu = base.gpu
    counts = Counter(i.profile for i in base.current)
    dynamic = replace(base, dynamic=True, desired=tuple(sorted(counts.items())))
    if not gpu.mig_enabled and gpu.uuid in holders:
        return replace(
            dynamic,
            pending=_waiting([holders[gpu.uuid]], " before MIG mode can be turned on"),
        )
    return replace(
        dynamic,
        plan=MigPlan(keep=base.current, destroy=(), create=()),
        mode=None if gpu.mig_pending else "enable",
    )


def _unknown_holders(action: GpuMigAction, *, known: bool) -> GpuMigAction:
    """Without knowing which pods hold what, only creating instances is safe."""
    if known or not action.changes:
        return action
    if action.mode is None and (action.plan is None or not action.plan.destroy):
        return action
    return replace(
        action,
        pending="which devices pods hold is unknown (kubelet's PodResources API did not "
        "answer), so no instance is destroyed and MIG mode is not changed until it does",
    )


def mig_actions(
    config: Config, inventory: Inventory, held: Mapping[str, Holder] | None = NOTHING_HELD
) -> MigActions:
    """Per GPU a `partitioning.mig` entry selects: what to do; empty without `partitioning`.

    `held` maps device IDs that pods hold (MIG or GPU UUIDs, or replica IDs ``<uuid>::<n>``)
    to the pod holding them; None when that is unknown (PodResources unreachable), and then
    nothing is destroyed and no MIG mode changes: only creations go ahead. Impossible layouts
    come back both as the GPU's `error` and as a `Problem` at the entry's `profiles`, so `plan`
    can print them like `validate` does.
    """
    selected, problems = select_layouts(config.partitioning, inventory)
    actions = tuple(
        _unknown_holders(_action(s, held or {}), known=held is not None) for s in selected
    )
    for action in actions:
        if action.error is not None:
            where = "profiles" if action.enabled else "enabled"
            problems.append(
                Problem(
                    f"{entry_path(action.entry)}.{where}",
                    f"GPU {action.gpu.index} ({action.gpu.uuid}): {action.error}",
                )
            )
    return MigActions(actions=actions, problems=tuple(problems))
