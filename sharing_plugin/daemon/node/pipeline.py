"""The one node pipeline: config in, `Applied` or `Rejected` out, for every serving command.

    pipeline = NodePipeline(options.source, nvml=nvml, consumer=self, tasks=..., reports=...)
    api = await pipeline.connect()   # the API client, the node label, the node status reporter
    first = await pipeline.start()   # the config source, the first update, then every later one

`run`, `run-dra` and `mps-control` differ only in what they do with a planned config; the
steps before are the same and live here, once: following the config (the mounted file or
directory, the ConfigMap through the API, the node label naming a config, SIGHUP), finding the
GPUs (and finding them again when the driver loads after the plugin), carrying out declared MIG
layouts (where the command does), `plan_node`, placing every problem at its line in the text the
config was read from, counting generations, and reporting (logs, /status, metrics, Node events
and the config-state label, GFD labels). Its consumer is handed values, never asked to read the
pipeline back: a `NodeView` of each `Applied` (the plan with GPU health applied, the node's GPUs
and faults now), which `check` may refuse (the plan does not fit what the consumer serves) and
whose checked result `apply` serves; `serve_again` hands a fresh view when the node changes under
the last `Applied` (GPU health, a MIG instance made for a claim, or the consumer's own ask). One
lock orders every update, re-apply and node change, so a consumer never sees two at once; it is
taken here only, and what a consumer needs done under it is a method here. Every outcome is
published to subscribers (`outcomes()`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Generic

from sharing_plugin.config.loader import LoadedConfig
from sharing_plugin.config.memory import hook_path
from sharing_plugin.config.model import Config
from sharing_plugin.config.options import with_driver_root
from sharing_plugin.daemon.node.consumer import (
    PLAIN_PIPELINE,
    Checked,
    PipelineOptions,
    PlanConsumer,
)
from sharing_plugin.daemon.node.discovery import GpuDiscovery
from sharing_plugin.daemon.node.gpu_health import NodeHealth
from sharing_plugin.daemon.node.kube import ConfigFeed, config_feed
from sharing_plugin.daemon.node.layouts import MigLayouts
from sharing_plugin.daemon.node.mig import MigReconciler
from sharing_plugin.daemon.node.node_side import Connection, NodeSide
from sharing_plugin.daemon.node.options import SourceOptions
from sharing_plugin.daemon.node.outcome import Applied, NodeView, Outcome, Outcomes, Rejected
from sharing_plugin.daemon.node.report import Reports
from sharing_plugin.errors import PlanError, Problem, SharingPluginError, StartupError
from sharing_plugin.gpus.health_tracker import Fault
from sharing_plugin.gpus.inventory import Inventory, MigDevice
from sharing_plugin.kit.tasks import TaskOwner
from sharing_plugin.nvml.api import NvmlApi
from sharing_plugin.plan.caps import NodeFacts
from sharing_plugin.plan.node import plan_node
from sharing_plugin.sources.host import node_facts
from sharing_plugin.sources.update import ConfigUpdate, Trigger

if TYPE_CHECKING:
    from lightkube import AsyncClient

log = logging.getLogger(__name__)

_FOLLOW_BACKOFF_S = (0.2, 10.0)


class NodePipeline(Generic[Checked]):
    """Follows the config and the node, and hands each outcome to `consumer` (see the module
    doc), with the `pipeline_options` its command gives."""

    def __init__(
        self,
        options: SourceOptions,
        *,
        nvml: NvmlApi,
        consumer: PlanConsumer[Checked],
        tasks: TaskOwner,
        reports: Reports,
        kube_client: AsyncClient | None = None,
        pipeline_options: PipelineOptions = PLAIN_PIPELINE,
    ) -> None:
        self.options = options
        self._root = options.driver_root_default
        self.nvml = nvml
        self.reports = reports
        self._side = NodeSide(
            options,
            client=kube_client,
            tasks=tasks,
            reports=reports,
            node_report=pipeline_options.node_report,
            on_label=lambda: self.source.trigger(Trigger.LABEL_CHANGED) if self.source else None,
        )
        self._consumer = consumer
        self._tasks = tasks
        self._mig_held_by = pipeline_options.mig_held_by
        self._mig_retry_s = pipeline_options.mig_retry_s
        self._dynamic_mig = pipeline_options.dynamic_mig
        self._lock = asyncio.Lock()
        self.source: ConfigFeed | None = None
        self._discovery = GpuDiscovery(
            nvml,
            tasks=tasks,
            found=lambda: self.reapply(Trigger.GPUS_FOUND),
            first_delay_s=options.rediscover_s,
        )
        self._layouts: MigLayouts | None = None
        self._applied: Applied | None = None
        self._health = NodeHealth(
            pipeline_options.health_env,
            nvml=nvml,
            metrics=reports.metrics,
            tasks=tasks,
            on_change=self._on_health,
        )
        self._subscribers: list[Outcomes] = []

    # --- lifecycle ---------------------------------------------------------------------------

    async def connect(self) -> Connection:
        """The Kubernetes side: the client (when a feature needs it), the node label that names
        the config (read first, so the labelled config is the first one applied), and `run`'s
        node status reporter."""
        return await self._side.connect()

    async def start(self) -> Outcome:
        """The config source and its first update, whose outcome is returned; then every
        update, until `close`."""
        self.source = config_feed(
            self.options,
            self._side.client,
            label_value=lambda: self._side.label_value,
            on_trouble=self.reports.api_trouble,
        )
        if self._mig_held_by is not None:
            status = self.reports.status
            assert status is not None, "MIG layouts are shown in /status"
            self._layouts = MigLayouts(
                MigReconciler(self.nvml, metrics=self.reports.metrics),
                status=status,
                held_by=self._mig_held_by,
                tasks=self._tasks,
                # A pending layout is retried with the last good config, not the file: an edit
                # rejected meanwhile would be rejected again at every retry, and the good
                # config's layout would never be finished.
                retry=lambda: self.reapply(Trigger.MIG_RETRY),
                retry_s=self._mig_retry_s,
                dynamic=self._dynamic_mig,
            )
        self._health.log_settings()
        first = await self._handle(await self.source.start())
        assert first is not None, "an update read is always handled"
        self._tasks.spawn(self._follow(), name="config", eternal=True)
        return first

    async def close(self) -> None:
        """Stop following the config and take back what was published on the node itself
        (the NFD feature file; the Node's labels with `clearLabelsOnExit`). The tasks are the
        owner's to close; the API client is closed by `close_client`, after the consumer."""
        if self.source is not None:
            self.source.stop()
        await self._side.close()

    async def close_client(self) -> None:
        await self._side.close_client()

    def request_reload(self) -> None:
        """Re-read the config now (SIGHUP)."""
        if self.source is not None:
            self.source.trigger(Trigger.SIGHUP)

    async def reapply(self, trigger: Trigger) -> None:
        """Carry out the last good config again, on the node as it is now (a MIG layout that
        was pending, GPUs found after a start without them)."""
        await self._handle(None, trigger)

    # --- what consumers ask of the pipeline ----------------------------------------------------

    async def serve_again(self) -> None:
        """Hand the consumer the last `Applied` again, on the node as it is now, in turn with
        updates and health changes (what `run` does when an MPS daemon's state changes)."""
        async with self._lock:
            await self._serve_again()

    async def mig_devices_changed(self, gpu_uuid: str, devices: tuple[MigDevice, ...]) -> None:
        """GPU `gpu_uuid` has `devices` now (an instance made or destroyed for a DRA claim):
        later updates plan on that, health events on them are attributed to them, and the
        consumer serves the node so changed."""
        async with self._lock:
            inventory = self._discovery.inventory
            if inventory is not None:
                gpus = tuple(
                    replace(g, mig_devices=devices) if g.uuid == gpu_uuid else g
                    for g in inventory.gpus
                )
                self._node_changed(replace(inventory, gpus=gpus))
            await self._serve_again()

    def retry_mig_layout(self) -> None:
        """Something held was let go (a DRA claim unprepared): a declared MIG layout that waits
        for that is tried again now (nothing when none waits)."""
        if self._layouts is None or not self._layouts.pending:
            return
        try:
            self._tasks.spawn(self.reapply(Trigger.MIG_RETRY), name="mig-claims")
        except RuntimeError:  # stopping: nothing is retried any more
            log.debug("not retrying the pending MIG layout: stopping")

    # --- what tests read -------------------------------------------------------------------------

    @property
    def applied(self) -> Applied | None:
        """The last `Applied`, the one being served."""
        return self._applied

    @property
    def inventory(self) -> Inventory | None:
        """The node's GPUs as they are now (None before the first discovery): the last
        `Applied`'s, or newer where instances were made or destroyed since."""
        return self._discovery.inventory

    @property
    def health(self) -> Mapping[str, bool]:
        """GPU and MIG UUID -> Healthy, as the health monitor last reported (absent: Healthy)."""
        return self._health.health

    @property
    def faults(self) -> Mapping[str, Fault]:
        """GPU and MIG UUID -> why it is Unhealthy, for the Unhealthy ones of `health`."""
        return self._health.faults

    @contextlib.contextmanager
    def outcomes(self) -> Iterator[Outcomes]:
        """Every outcome published from now on, while the `with` block lasts."""
        feed = Outcomes()
        self._subscribers.append(feed)
        try:
            yield feed
        finally:
            self._subscribers.remove(feed)

    # --- updates -------------------------------------------------------------------------------

    async def _follow(self) -> None:
        """Handle every config update until stopped. Whatever goes wrong on the way is logged
        and the watch taken up again: a plugin that silently stops reloading is the failure
        admins cannot see."""
        delay, limit = _FOLLOW_BACKOFF_S
        while True:
            try:
                assert self.source is not None
                async with contextlib.aclosing(self.source.updates()) as updates:
                    async for update in updates:
                        await self._handle(update)
                        delay = _FOLLOW_BACKOFF_S[0]
                return  # the source was stopped
            except Exception:
                log.exception("following the config failed; watching again in %.1f s", delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, limit)

    async def _handle(
        self, update: ConfigUpdate | None, trigger: Trigger = Trigger.START
    ) -> Outcome | None:
        """One update (None: the last good config again, for `trigger`), start to end."""
        async with self._lock:
            if update is not None:
                outcome = await self._outcome(update.name, update.loaded, update.trigger, update)
            elif self._applied is not None:  # chosen under the lock: never a replaced config
                last = self._applied
                outcome = await self._outcome(last.name, last.loaded, trigger, None)
            else:
                return None  # nothing good applied yet: nothing to carry out again
            for feed in list(self._subscribers):
                feed.put(outcome)
            return outcome

    async def _outcome(
        self,
        name: str | None,
        loaded: LoadedConfig | None,
        trigger: Trigger,
        update: ConfigUpdate | None,
    ) -> Outcome:
        if update is not None and update.error is not None:
            return self._reject(update.error.problems, trigger)
        config = loaded.config if loaded else Config()
        if (flags := with_driver_root(config.flags, self._root)) is not config.flags:
            config = config.model_copy(update={"flags": flags})
        try:
            inventory = await self._discovery.inventory_for(config)
            inventory = await self._partition(config, inventory)
            applied = Applied(
                config=config,
                loaded=loaded,
                name=name,
                inventory=inventory,
                plan=plan_node(config, inventory, as_is=True, facts=self._facts(config)).plan,
                generation=self._generation_of(name, loaded),
                trigger=trigger,
            )
            node = self._health.view(applied, inventory)
            checked = self._consumer.check(node)
        except PlanError as exc:
            return self._reject(_placed(exc.problems, loaded), trigger)
        except StartupError:
            raise
        except SharingPluginError as exc:
            problems = [Problem("", line) for line in str(exc).splitlines() or [str(exc)]]
            return self._reject(problems, trigger, config_fault=False)
        await self._apply(node, checked)
        return applied

    def _facts(self, config: Config) -> NodeFacts | None:
        if not config.memory_limits.on:
            return None
        hook = hook_path(config.memory_limits, self.options.hook_path_default)
        return node_facts(cgroup_version=self.options.cgroup_version, hook_path=hook)

    def _generation_of(self, name: str | None, loaded: LoadedConfig | None) -> int:
        last = self._applied
        if last is None:
            return 1
        same = (last.name, last.source_hash) == (name, loaded.source_hash if loaded else "")
        return last.generation if same else last.generation + 1

    async def _partition(self, config: Config, inventory: Inventory) -> Inventory:
        """Make the GPUs' MIG layout match `partitioning.mig`; the node as it is afterwards."""
        if self._layouts is None:
            return inventory
        done = await self._layouts.apply(config, inventory)
        self.reports.node.mig(done.states, done.inventory)
        if done.changed:
            self._node_changed(done.inventory)
        return done.inventory

    def _node_changed(self, inventory: Inventory) -> None:
        """The GPUs are now as `inventory` says: later updates plan on it, and health events
        on new MIG devices are attributed to them."""
        self._discovery.inventory = inventory
        self._health.inventory_changed(inventory)

    async def _serve_again(self) -> None:
        if self._applied is not None:
            node = self._discovery.inventory or self._applied.inventory
            await self._consumer.serve_again(self._health.view(self._applied, node))

    async def _apply(self, node: NodeView, checked: Checked) -> None:
        applied = node.applied
        new = self._applied is None or applied.generation != self._applied.generation
        self._applied = applied
        fields = {"generation": applied.generation}
        if new:
            loaded = applied.loaded
            for warning in (*(loaded.warnings if loaded else ()), *applied.plan.warnings):
                log.warning("config: %s", warning, extra=fields)
            for note in loaded.notes if loaded else ():
                log.info("config: %s", note, extra=fields)
        if not applied.trigger.reapplies:  # a re-apply is no reload: lastError stays
            self.reports.applied(applied)
        served = await self._consumer.apply(node, checked)
        await self._side.publish_labels(applied.config, applied.inventory, applied.plan)
        log.log(
            logging.DEBUG if applied.trigger.reapplies and not served.changed else logging.INFO,
            "config %s applied (%s, generation %d): %s",
            applied.shown_name,
            applied.trigger.value,
            applied.generation,
            served.summary,
            extra={
                "config": applied.name or "",
                "hash": applied.source_hash,
                "generation": applied.generation,
                "reason": applied.trigger.value,
            },
        )
        self._health.follow(applied.config, applied.inventory)

    def _reject(
        self, problems: Iterable[Problem], trigger: Trigger, *, config_fault: bool = True
    ) -> Rejected:
        rejected = Rejected(tuple(problems), trigger, config_fault=config_fault)
        kept = self._applied.generation if self._applied is not None else None
        self.reports.rejected(rejected, kept=kept)
        return rejected

    # --- GPU health ----------------------------------------------------------------------------

    async def _on_health(self, health: Mapping[str, bool]) -> None:
        async with self._lock:
            before = self._health.record(health)
            self.reports.node.health(before, health, self._discovery.inventory)
            await self._serve_again()


def _placed(problems: Iterable[Problem], loaded: LoadedConfig | None) -> list[Problem]:
    """Plan problems at the lines of the text the config was read from, like `validate`'s."""
    return [loaded.place(p) if loaded is not None else p for p in problems]
