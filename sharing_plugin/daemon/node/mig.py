"""The MIG reconciler: make each GPU's MIG layout match `partitioning.mig`, through NVML.

What to do is decided before anything is touched (the pure actions: the solver's plan with held
instances pinned, pending and error reasons); this module only carries it out, GPU by GPU, in a
worker thread because every NVML call blocks. Order per GPU: MIG mode on, destroys, creates with
explicit placements, MIG mode off, which is the order the driver accepts them in (it refuses to
leave MIG mode while GPU instances exist, and a created instance may need the slices a destroyed
one frees). A failure on one GPU stops that GPU only and is reported as its error state, never
raised: the rest of the node keeps serving. After any change the node is discovered again and
the actions recomputed, so the state reported is what NVML now says, not what was hoped for.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sharing_plugin.config.model import Config
from sharing_plugin.errors import MigError, NvmlError, Problem, SharingPluginError
from sharing_plugin.gpus.catalog import MigProfileSpec, model_for
from sharing_plugin.gpus.holders import Holder
from sharing_plugin.gpus.inventory import Gpu, Inventory
from sharing_plugin.mig.desired import RESET_NEEDED, GpuMigAction, mig_actions
from sharing_plugin.mig.layout import MigInstance
from sharing_plugin.mig.state import MigState, state_of
from sharing_plugin.nvml.api import NvmlApi
from sharing_plugin.nvml.discover import discover
from sharing_plugin.nvml.mig_ops import (
    CreatedMigDevice,
    create_compute_instance,
    create_gpu_instance,
    destroy_mig_device,
    set_mig_mode,
)
from sharing_plugin.observability.metrics import Metrics

log = logging.getLogger(__name__)

__all__ = ["MigOutcome", "MigReconciler", "make_mig_device", "mig_operation"]

_T = TypeVar("_T")


def mig_operation(
    metrics: Metrics | None, name: str, call: Callable[..., _T], *args: Any, **kwargs: Any
) -> _T:
    """One NVML MIG operation, counted in the metrics by name and result."""
    try:
        result = call(*args, **kwargs)
    except NvmlError:
        if metrics is not None:
            metrics.count_mig_operation(name, ok=False)
        raise
    if metrics is not None:
        metrics.count_mig_operation(name)
    return result


def make_mig_device(
    nvml: NvmlApi, metrics: Metrics | None, gpu: Gpu, spec: MigProfileSpec, start: int
) -> CreatedMigDevice:
    """A GPU instance of `spec` at `start` and its compute instance, each counted. When the
    compute instance cannot be made the GPU instance is given back: without one it is no MIG
    device, nothing would advertise it, yet it would hold its slices."""
    gi_id = mig_operation(
        metrics,
        "create-gpu-instance",
        create_gpu_instance,
        nvml,
        gpu.uuid,
        profile_index=spec.gi_profile_id,
        start=start,
    )
    try:
        return mig_operation(
            metrics,
            "create-compute-instance",
            create_compute_instance,
            nvml,
            gpu.uuid,
            gi_id=gi_id,
            ci_profile_index=spec.ci_profile_id,
        )
    except NvmlError:
        try:
            destroy_mig_device(nvml, gpu.uuid, gi_id=gi_id, ci_id=None)
        except NvmlError as exc:
            log.error("GPU %d: giving back GPU instance %d: %s", gpu.index, gi_id, exc)
        raise


@dataclass(frozen=True, slots=True)
class MigOutcome:
    """What a reconcile did: the node as it is now, and per GPU where its layout stands.

    `states` holds one entry per GPU a `partitioning.mig` entry selects (none without
    `partitioning`); `problems` are selection errors not tied to one GPU, and impossible layouts.
    """

    inventory: Inventory
    states: dict[str, tuple[MigState, str | None]] = field(default_factory=dict)
    changed: bool = False
    problems: tuple[Problem, ...] = ()


class _Pending(Exception):
    """The GPU cannot go further until something outside the plugin happens (a reset)."""


class MigReconciler:
    """Applies MIG layouts through a pynvml-like module (the real one or the simulator)."""

    def __init__(self, nvml: NvmlApi, *, metrics: Metrics | None = None) -> None:
        self._nvml = nvml
        self._metrics = metrics
        self._lock = asyncio.Lock()  # one reconcile at a time: NVML MIG calls do not compose

    async def reconcile(
        self,
        config: Config,
        inventory: Inventory,
        held_by: Mapping[str, Holder] | None = None,
    ) -> MigOutcome:
        """Bring every selected GPU to its declared layout, as far as pods and NVML allow.

        `held_by` maps the device IDs pods hold (MIG/GPU UUIDs or replica IDs ``<uuid>::<n>``)
        to (namespace, pod, container), from PodResources; None when that is unknown: then
        only instances are created, and what needs a destroy or a MIG mode change is pending.
        """
        if config.partitioning is None or not config.partitioning.mig:
            return MigOutcome(inventory=inventory)
        held = dict(held_by) if held_by is not None else None
        async with self._lock:
            planned = mig_actions(config, inventory, held)
            failures: dict[str, tuple[MigState, str | None]] = {}
            changed = False
            for action in planned.actions:
                if not action.changes:
                    continue
                changed = True
                try:
                    await asyncio.to_thread(self._apply, action)
                except _Pending as exc:
                    failures[action.gpu.uuid] = (MigState.PENDING, str(exc))
                except SharingPluginError as exc:
                    log.error("GPU %d (%s): MIG layout: %s", action.gpu.index, action.gpu.uuid, exc)
                    failures[action.gpu.uuid] = (MigState.ERROR, str(exc))
            if changed:
                try:
                    # failOnInitError is about starting: a GPU lost by now is reported in the
                    # inventory as unhealthy rather than failing the whole node.
                    inventory = await asyncio.to_thread(
                        discover, self._nvml, fail_on_init_error=False
                    )
                except SharingPluginError as exc:  # keep the old view; say why
                    log.error("re-discovering GPUs after MIG changes: %s", exc)
                    return MigOutcome(
                        inventory=inventory,
                        states={a.gpu.uuid: (MigState.ERROR, str(exc)) for a in planned.actions},
                        changed=True,
                        problems=planned.problems,
                    )
                planned = mig_actions(config, inventory, held)
        states: dict[str, tuple[MigState, str | None]] = {
            a.gpu.uuid: state_of(a) for a in planned.actions
        }
        states.update(failures)
        return MigOutcome(
            inventory=inventory, states=states, changed=changed, problems=planned.problems
        )

    # ---- in the worker thread ----

    def _apply(self, action: GpuMigAction) -> None:
        gpu = action.gpu
        where = f"GPU {gpu.index} ({gpu.uuid})"
        if action.mode == "enable":
            self._set_mode(gpu, enabled=True)
        plan = action.plan
        if plan is not None:
            for instance in plan.destroy:
                self._destroy(gpu, instance)
            model = model_for(gpu.product)
            mig = model.mig if model is not None else None
            for create in plan.create:
                spec = mig.profile(create.profile) if mig is not None else None
                if spec is None:  # the actions were built from this very catalog
                    raise MigError(f"{where}: {create.profile} is not a profile of {gpu.product}")
                self._create(gpu, spec, create.placement.start)
                log.info("%s: created %s", where, create)
        if action.mode == "disable":
            self._set_mode(gpu, enabled=False)

    def _create(self, gpu: Gpu, spec: MigProfileSpec, start: int) -> None:
        make_mig_device(self._nvml, self._metrics, gpu, spec, start)

    def _destroy(self, gpu: Gpu, instance: MigInstance) -> None:
        devices = [m for m in gpu.mig_devices if m.placement == instance.placement]
        if len(devices) != 1:
            raise MigError(
                f"GPU {gpu.index} ({gpu.uuid}): {instance} holds {len(devices)} compute "
                "instances; the plugin only removes GPU instances with one compute instance "
                "spanning them: destroy it by hand (nvidia-smi mig -dci, -dgi)"
            )
        mig = devices[0]
        self._op(
            "destroy-gpu-instance",
            destroy_mig_device,
            self._nvml,
            gpu.uuid,
            gi_id=mig.gi_id,
            ci_id=mig.ci_id,
        )
        log.info("GPU %d (%s): destroyed %s", gpu.index, gpu.uuid, instance)

    def _set_mode(self, gpu: Gpu, *, enabled: bool) -> None:
        state = self._op(
            "enable-mig-mode" if enabled else "disable-mig-mode",
            set_mig_mode,
            self._nvml,
            gpu.uuid,
            enabled=enabled,
        )
        if state.reset_required:
            # NVML sets the pending mode; it becomes current only after a GPU reset, which
            # would end every process on the GPU. That is for the admin to schedule.
            log.warning("GPU %d (%s): %s", gpu.index, gpu.uuid, RESET_NEEDED)
            raise _Pending(
                f"{RESET_NEEDED}: run nvidia-smi -r -i {gpu.index} (or reboot) when the GPU is idle"
            )

    def _op(self, name: str, call: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        return mig_operation(self._metrics, name, call, *args, **kwargs)
