"""The one node pipeline: config in, `Applied` or `Rejected` out, for every serving command.

    pipeline = NodePipeline(options.source, nvml=nvml, consumer=self, tasks=..., reports=...)
    await pipeline.connect()   # the API client, the node label, the node status reporter
    await pipeline.start()     # the config source, the first update, then every later one

`run`, `run-dra` and `mps-control` differ only in what they do with a planned config; the
steps before are the same and live here, once: following the config (the mounted file or
directory, the ConfigMap through the API, the node label naming a config, SIGHUP), finding the
GPUs (and finding them again when the driver loads after the plugin), carrying out declared MIG
layouts (where the command does), `plan_node`, placing every problem at its line in the text the
config was read from, counting generations, and reporting (logs, /status, metrics, Node events
and the config-state label, GFD labels). Its consumer is handed values: `check` may refuse an
`Applied` (the plan does not fit what the consumer serves), `apply` serves it, and
`health_changed` follows GPU health. One lock orders every update, re-apply and health change,
so a consumer never sees two at once. Every outcome is published to subscribers (`outcomes()`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from sharing_plugin.config.loader import LoadedConfig
from sharing_plugin.config.model import Config
from sharing_plugin.daemon.node.discovery import GpuDiscovery
from sharing_plugin.daemon.node.health_monitor import HealthEnv, HealthMonitor
from sharing_plugin.daemon.node.kube import ConfigFeed, api_client, config_feed
from sharing_plugin.daemon.node.labels import LabelPublisher
from sharing_plugin.daemon.node.layouts import MigLayouts
from sharing_plugin.daemon.node.mig import MigReconciler
from sharing_plugin.daemon.node.options import NodeReportOptions, SourceOptions
from sharing_plugin.daemon.node.outcome import Applied, Outcome, Outcomes, Rejected, Served
from sharing_plugin.daemon.node.report import NodeReport, Reports
from sharing_plugin.daemon.node.tasks import TaskOwner
from sharing_plugin.errors import PlanError, Problem, SharingPluginError, StartupError
from sharing_plugin.gpus.health_tracker import Fault
from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.mig.desired import Holder
from sharing_plugin.nvml.api import NvmlApi
from sharing_plugin.plan.model import Plan
from sharing_plugin.plan.node import plan_node
from sharing_plugin.sources.nodelabel import NodeLabelWatcher
from sharing_plugin.sources.update import ConfigUpdate, Trigger

if TYPE_CHECKING:
    from lightkube import AsyncClient

log = logging.getLogger(__name__)

_LABEL_FETCH_TIMEOUT_S = 5.0
_FOLLOW_BACKOFF_S = (0.2, 10.0)
_CLEAR_TIMEOUT_S = 1.0
_FLUSH_TIMEOUT_S = 1.0

HeldBy = Callable[[], Awaitable[Mapping[str, Holder] | None]]
"""Which MIG devices are held, and by whom (None: unknown): PodResources for `run`, prepared
claims in DRA."""


@dataclass(frozen=True, slots=True)
class PipelineFeatures:
    """What a command's pipeline does beyond config -> plan: GPU health watching
    (`health_env`: `run`, `run-dra`), carrying out `partitioning.mig` (`mig_held_by`: which MIG
    devices are held, retried every `mig_retry_s` while a layout waits; `dynamic_mig`: why
    dynamic entries cannot be served now, None when they are (MIG mode turned on, the
    instances left to the command); without it a config with one is rejected naming
    `run-dra`), `run`'s Node status and GFD labels (`node_report`)."""

    health_env: HealthEnv | None = None
    mig_held_by: HeldBy | None = None
    mig_retry_s: float = 2.0
    dynamic_mig: Callable[[], str | None] | None = None
    node_report: NodeReportOptions | None = None


NO_FEATURES = PipelineFeatures()
"""Config to plan only (`mps-control`)."""


class PlanConsumer(Protocol):
    """What a serving command does with the pipeline's values (called under its lock)."""

    def check(self, applied: Applied) -> None:
        """Raise PlanError if this plan cannot be served: the config is then rejected and the
        consumer keeps serving the last one. Nothing of the consumer's has changed yet; the
        pipeline's MIG step has already run (the plan is of the node it made)."""

    async def apply(self, applied: Applied) -> Served:
        """Serve `applied` (a new config, or the last good one on a changed node)."""

    async def health_changed(self) -> None:
        """GPU health changed (`NodePipeline.health`): serve the last `Applied` accordingly."""


class NodePipeline:
    """Follows the config and the node, and hands each outcome to `consumer` (see the module
    doc), with the `features` its command has."""

    def __init__(
        self,
        options: SourceOptions,
        *,
        nvml: NvmlApi,
        consumer: PlanConsumer,
        tasks: TaskOwner,
        reports: Reports,
        kube_client: AsyncClient | None = None,
        features: PipelineFeatures = NO_FEATURES,
    ) -> None:
        self.options = options
        self.nvml = nvml
        self.reports = reports
        self.client = kube_client
        self._own_client: AsyncClient | None = None  # made here, so closed here
        self._consumer = consumer
        self._tasks = tasks
        self._health_env = features.health_env
        self._node_report = features.node_report
        self._mig_held_by = features.mig_held_by
        self._mig_retry_s = features.mig_retry_s
        self._dynamic_mig = features.dynamic_mig
        self.lock = asyncio.Lock()
        self.source: ConfigFeed | None = None
        self._discovery = GpuDiscovery(
            nvml,
            tasks=tasks,
            found=lambda: self.reapply(Trigger.GPUS_FOUND),
            first_delay_s=options.rediscover_s,
        )
        self._layouts: MigLayouts | None = None
        self._labels = LabelPublisher(file=None, reporter=None)
        self._label_value: str | None = None
        self._applied: Applied | None = None
        self._health: dict[str, bool] = {}
        self._faults: dict[str, Fault] = {}
        self._health_monitor: HealthMonitor | None = None
        self._subscribers: list[Outcomes] = []

    # --- lifecycle ---------------------------------------------------------------------------

    async def connect(self) -> None:
        """The Kubernetes side: the client (when a feature needs it), the node label that names
        the config (read first, so the labelled config is the first one applied), and `run`'s
        node status reporter."""
        if self.client is None and self.options.needs_api:
            self.client = self._own_client = api_client(self.options)
        await self._watch_label()
        self._start_node_report()

    async def start(self) -> None:
        """The config source and its first update; then every update, until `close`."""
        self.source = config_feed(
            self.options,
            self.client,
            label_value=lambda: self._label_value,
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
        if self._health_env is not None:
            if described := self._health_env.describe():
                log.info("health checks: %s", described)
            for problem in self._health_env.problems:
                log.warning("health checks: %s", problem)
        await self._handle(await self.source.start())
        self._tasks.spawn(self._follow(), name="config", eternal=True)

    async def close(self) -> None:
        """Stop following the config and take back what was published on the node itself
        (the NFD feature file; the Node's labels with `clearLabelsOnExit`). The tasks are the
        owner's to close; the API client is closed by `close_client`, after the consumer."""
        if self.source is not None:
            self.source.stop()
        await self._labels.close()
        reporter = self.reports.node.reporter
        if reporter is not None:
            # What was reported last (a rejected edit's state label, its event) is still being
            # written in the background: let it finish, within a bound, before the tasks stop.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_FLUSH_TIMEOUT_S):
                    await reporter.flush()
        if reporter is not None and self._node_report and self._node_report.clear_labels_on_exit:
            try:
                async with asyncio.timeout(_CLEAR_TIMEOUT_S):
                    await reporter.clear()
            except Exception as exc:
                log.warning("clearing node %s's labels: %s", reporter.node_name, exc)

    async def close_client(self) -> None:
        if self._own_client is not None:
            await self._own_client.close()
            self._own_client = None

    def request_reload(self) -> None:
        """Re-read the config now (SIGHUP)."""
        if self.source is not None:
            self.source.trigger(Trigger.SIGHUP)

    async def reapply(self, trigger: Trigger) -> None:
        """Carry out the last good config again, on the node as it is now (a MIG layout that
        was pending, GPUs found after a start without them)."""
        await self._handle(None, trigger)

    # --- what consumers and tests read ---------------------------------------------------------

    @property
    def applied(self) -> Applied | None:
        """The last `Applied`, the one being served."""
        return self._applied

    @property
    def mig_pending(self) -> bool:
        """Whether a declared MIG layout waits for something to be released."""
        return self._layouts is not None and self._layouts.pending

    @property
    def inventory(self) -> Inventory | None:
        """The node's GPUs as they are now (None before the first discovery): the last
        `Applied`'s, or newer where instances were made or destroyed since."""
        return self._discovery.inventory

    @property
    def health(self) -> Mapping[str, bool]:
        """GPU and MIG UUID -> Healthy, as the health monitor last reported (absent: Healthy)."""
        return dict(self._health)

    @property
    def faults(self) -> Mapping[str, Fault]:
        """GPU and MIG UUID -> why it is Unhealthy, for the Unhealthy ones of `health`."""
        return dict(self._faults)

    def healthy_plan(self, applied: Applied) -> Plan:
        """`applied.plan` with the devices of Unhealthy GPUs marked, when health checks are on."""
        if not self._health_checked(applied):
            return applied.plan
        return applied.plan.with_health(self._health)

    def unhealthy(self, applied: Applied) -> set[str]:
        """The GPU and MIG UUIDs the health watch has marked Unhealthy, when health checks are
        on for `applied`'s config (none otherwise)."""
        if not self._health_checked(applied):
            return set()
        return {uuid for uuid, ok in self._health.items() if not ok}

    def _health_checked(self, applied: Applied) -> bool:
        env = self._health_env
        return env is not None and env.settings(applied.config.health).enabled

    @contextlib.contextmanager
    def outcomes(self) -> Iterator[Outcomes]:
        """Every outcome published from now on, while the `with` block lasts."""
        feed = Outcomes()
        self._subscribers.append(feed)
        try:
            yield feed
        finally:
            self._subscribers.remove(feed)

    # --- the node side -------------------------------------------------------------------------

    async def _watch_label(self) -> None:
        node, client = self.options.node_name, self.client
        if node is None or client is None:
            return
        watcher = NodeLabelWatcher(
            node,
            label=self.options.config_label,
            client=client,
            on_trouble=self.reports.api_trouble,
        )
        try:
            async with asyncio.timeout(_LABEL_FETCH_TIMEOUT_S):
                self._label_value = await watcher.fetch()
        except (SharingPluginError, OSError, TimeoutError) as exc:
            log.warning("reading node %s's labels: %s", node, exc)
        self._tasks.spawn(watcher.run(self._on_label), name="node-label", eternal=True)

    def _on_label(self, value: str | None) -> None:
        if value == self._label_value:
            return
        log.info("node label %s is now %r", self.options.config_label, value)
        self._label_value = value
        if self.source is not None:
            self.source.trigger(Trigger.LABEL_CHANGED)

    def _start_node_report(self) -> None:
        wanted = self._node_report
        if wanted is None:
            return
        node, client = self.options.node_name, self.client
        reporter = None
        if node is not None and client is not None and (wanted.node_status or wanted.node_labels):
            from sharing_plugin.observability.nodestatus import NodeStatusReporter

            reporter = NodeStatusReporter(client, node)
            self._tasks.spawn(reporter.run(), name="node-status", eternal=True)
        elif wanted.node_labels:
            log.warning("--node-labels needs --node-name and Kubernetes credentials: off")
        self.reports.node = NodeReport(reporter if wanted.node_status else None)
        self._labels = LabelPublisher(
            file=wanted.labels_file, reporter=reporter if wanted.node_labels else None
        )

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

    async def _handle(self, update: ConfigUpdate | None, trigger: Trigger = Trigger.START) -> None:
        """One update (None: the last good config again, for `trigger`), start to end."""
        async with self.lock:
            if update is not None:
                outcome = await self._outcome(update.name, update.loaded, update.trigger, update)
            elif self._applied is not None:  # chosen under the lock: never a replaced config
                last = self._applied
                outcome = await self._outcome(last.name, last.loaded, trigger, None)
            else:
                return  # nothing good applied yet: nothing to carry out again
            for feed in list(self._subscribers):
                feed.put(outcome)

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
        try:
            inventory = await self._discovery.inventory_for(config)
            inventory = await self._partition(config, inventory)
            applied = Applied(
                config=config,
                loaded=loaded,
                name=name,
                inventory=inventory,
                plan=plan_node(config, inventory, as_is=True).plan,
                generation=self._generation_of(name, loaded),
                trigger=trigger,
            )
            self._consumer.check(applied)
        except PlanError as exc:
            return self._reject(_placed(exc.problems, loaded), trigger)
        except StartupError:
            raise
        except SharingPluginError as exc:
            problems = [Problem("", line) for line in str(exc).splitlines() or [str(exc)]]
            return self._reject(problems, trigger, config_fault=False)
        await self._apply(applied)
        return applied

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
        inventory, changed = await self._layouts.apply(config, inventory)
        self.reports.node.mig(self._layouts.states, inventory)
        if changed:
            self.node_changed(inventory)
        return inventory

    def node_changed(self, inventory: Inventory) -> None:
        """The GPUs are now as `inventory` says (a MIG layout applied, or an instance made or
        destroyed for a DRA claim): later updates plan on it, and health events on new MIG
        devices are attributed to them."""
        self._discovery.inventory = inventory
        if self._health_monitor is not None:
            self._health_monitor.update_inventory(inventory)

    async def _apply(self, applied: Applied) -> None:
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
        served = await self._consumer.apply(applied)
        await self._labels.publish(applied.config, applied.inventory, applied.plan)
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
        self._ensure_health_monitor(applied.config, applied.inventory)

    def _reject(
        self, problems: Iterable[Problem], trigger: Trigger, *, config_fault: bool = True
    ) -> Rejected:
        rejected = Rejected(tuple(problems), trigger, config_fault=config_fault)
        kept = self._applied.generation if self._applied is not None else None
        self.reports.rejected(rejected, kept=kept)
        return rejected

    # --- GPU health ----------------------------------------------------------------------------

    def _ensure_health_monitor(self, config: Config, inventory: Inventory) -> None:
        if self._health_env is None:
            return
        settings = self._health_env.settings(config.health)
        if self._health_monitor is not None:
            self._health_monitor.update_settings(settings)
            return
        if not inventory.gpus:
            return  # nothing to watch (no GPUs yet, or NVML absent with failOnInitError: false)
        self._health_monitor = HealthMonitor(
            self.nvml,
            inventory,
            settings=settings,
            on_change=self._on_health,
            metrics=self.reports.metrics,
        )
        self._tasks.spawn(self._health_monitor.run(), name="health", eternal=True)

    async def _on_health(self, health: Mapping[str, bool]) -> None:
        async with self.lock:
            before, self._health = self._health, dict(health)
            monitor = self._health_monitor
            self._faults = dict(monitor.faults) if monitor is not None else {}
            self.reports.node.health(before, self._health, self._discovery.inventory)
            if self._applied is not None:
                await self._consumer.health_changed()


def _placed(problems: Iterable[Problem], loaded: LoadedConfig | None) -> list[Problem]:
    """Plan problems at the lines of the text the config was read from, like `validate`'s."""
    return [loaded.place(p) if loaded is not None else p for p in problems]
