"""The daemon: config source, GPUs, health and MIG, wired to the supervisor and kubelet.

    async with Daemon(options, nvml=backend_from_spec(options.gpus)) as daemon:
        await daemon.wait_stopped()      # until request_stop() (SIGTERM/SIGINT) is called

Start order (each gate before the next): read the config, discover the GPUs, apply the declared
MIG layout, plan, start and register every resource server, then watch everything that can
change the plan: the config (file, mounted ConfigMap, node label, SIGHUP), kubelet restarts, and
GPU health. A config that does not validate or does not fit the node changes nothing: the last
good one keeps serving and the error is logged, counted and shown in /status. At start, with no
good config yet, nothing is advertised until one arrives; the process stays up so that fixing
the ConfigMap is enough.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from sharing_plugin import installed_version
from sharing_plugin.config.loader import LoadedConfig
from sharing_plugin.config.model import Config
from sharing_plugin.daemon.health_monitor import HealthMonitor
from sharing_plugin.daemon.kube import ConfigFedService, api_client, config_feed, needs_api
from sharing_plugin.daemon.labels import LabelPublisher
from sharing_plugin.daemon.layouts import MigLayouts
from sharing_plugin.daemon.mig import MigReconciler
from sharing_plugin.daemon.mps_gate import MpsGate
from sharing_plugin.daemon.options import RunOptions
from sharing_plugin.daemon.report import NodeReport
from sharing_plugin.daemon.supervisor import Supervisor
from sharing_plugin.daemon.tasks import TaskOwner
from sharing_plugin.daemon.usage import UsageMonitor
from sharing_plugin.errors import (
    ConfigError,
    NvmlError,
    PlanError,
    SharingPluginError,
    StartupError,
)
from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.kubelet.podresources import PodResourcesClient
from sharing_plugin.kubelet.server import AllocateContext
from sharing_plugin.kubelet.watch import KubeletWatcher
from sharing_plugin.nvml.api import NvmlApi
from sharing_plugin.nvml.discover import discover
from sharing_plugin.observability.http_server import MetricsServer
from sharing_plugin.observability.metrics import Metrics
from sharing_plugin.observability.status import StatusBoard
from sharing_plugin.plan import CONTROL_DEVICE_NODES
from sharing_plugin.plan.model import Plan
from sharing_plugin.plan.node import plan_node
from sharing_plugin.sources.filewatch import ConfigUpdate
from sharing_plugin.sources.nodelabel import NodeLabelWatcher

if TYPE_CHECKING:
    from lightkube import AsyncClient

log = logging.getLogger(__name__)

# Reasons to carry out the last good config again; neither is a reload of the config.
_MIG_RETRY = "MIG layout pending"
_REDISCOVERED = "GPUs found"
_REAPPLY = frozenset({_MIG_RETRY, _REDISCOVERED})
_REDISCOVER_MAX_S = 300.0
_LABEL_FETCH_TIMEOUT_S = 5.0
_FOLLOW_BACKOFF_S = (0.2, 10.0)
_CLEAR_TIMEOUT_S = 1.0


class Daemon(ConfigFedService):
    """One running plugin; an async context manager that starts in order and stops cleanly."""

    def __init__(
        self,
        options: RunOptions,
        *,
        nvml: NvmlApi,
        kube_client: AsyncClient | None = None,
    ) -> None:
        """`nvml` is the NVML the entry chose for `options.gpus` (the real module or the
        simulator); `kube_client` replaces the credentials found in the environment."""
        super().__init__()
        self.options = options
        self._kube_client = kube_client
        self.metrics = Metrics(version=installed_version())
        self.status = StatusBoard()
        self.nvml = nvml
        self._tasks = TaskOwner("daemon")
        self._label_value: str | None = None
        self._loaded: LoadedConfig | None = None
        self._config_name: str | None = None
        self._generation = 0
        self._inventory: Inventory | None = None
        self._health: dict[str, bool] = {}
        self._base_plan: Plan | None = None
        self._metrics_server: MetricsServer | None = None
        self._health_monitor: HealthMonitor | None = None
        self._layouts: MigLayouts | None = None
        self._label_watcher: NodeLabelWatcher | None = None
        self.report = NodeReport(None)
        self._labels = LabelPublisher(file=None, reporter=None)
        self._own_client: AsyncClient | None = None  # made here, so closed here
        self._api_trouble: str | None = None
        self.pod_resources = PodResourcesClient(options.kubelet_dir)
        self.usage = UsageMonitor(
            nvml=nvml,
            proc_root=options.proc_root,
            metrics=self.metrics,
            status=self.status,
            pod_resources=self.pod_resources,
        )
        self.supervisor = Supervisor(
            kubelet_dir=options.kubelet_dir,
            metrics=self.metrics,
            status=self.status,
            pod_resources=self.pod_resources,
            drain_recheck_s=options.drain_recheck_s,
            grant_window_s=options.grant_window_s,
        )
        self._reload_lock = asyncio.Lock()
        self._update_waiters: list[asyncio.Future[None]] = []
        self.mps = MpsGate(
            tasks=self._tasks, status=self.status, metrics=self.metrics, on_change=self._on_mps
        )

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        if self.options.metrics_address is not None:
            host, port = self.options.metrics_address
            self._metrics_server = MetricsServer(
                host, port, self.metrics, self.status, refresh=self.usage.refresh
            )
            await self._metrics_server.start()
        if self._kube_client is None and needs_api(self.options):
            self._kube_client = self._own_client = api_client(self.options)
        await self._start_label_watch()
        self._start_node_status()
        self.usage.start(
            client=self._kube_client,
            node_name=self.options.node_name,
            reporter=self.report.reporter,
        )
        self.source = config_feed(
            self.options,
            self._kube_client,
            label_value=lambda: self._label_value,
            on_trouble=self._on_api_trouble,
        )
        self._layouts = MigLayouts(
            MigReconciler(self.nvml, metrics=self.metrics),
            status=self.status,
            pod_resources=self.pod_resources,
            tasks=self._tasks,
            # A pending layout is retried with the last good config, not the file: an edit
            # rejected meanwhile would be rejected again at every retry, and the good config's
            # layout would never be finished.
            retry=lambda: self._on_update(None, reapply=_MIG_RETRY),
            retry_s=self.options.drain_recheck_s,
        )
        described = self.options.health_env.describe()
        if described:
            log.info("health checks: %s", described)
        for problem in self.options.health_env.problems:
            log.warning("health checks: %s", problem)
        update = await self.source.start()
        await self._on_update(update)
        self._tasks.spawn(self._follow_config(), name="config", eternal=True)
        watcher = KubeletWatcher(
            self.options.kubelet_dir,
            self.supervisor.kubelet_restarted,
            self.supervisor.socket_removed,
            own_sockets=self.supervisor.own_sockets,
        )
        self._tasks.spawn(watcher.run(), name="kubelet-watch", eternal=True)

    async def _start_label_watch(self) -> None:
        if self.options.node_name is None:
            return
        client = self._kube_client
        if client is None:
            return
        self._label_watcher = NodeLabelWatcher(
            self.options.node_name,
            label=self.options.config_label,
            client=client,
            on_trouble=self._on_api_trouble,
        )
        # Pick the labelled config from the start rather than switching to it a moment later.
        try:
            async with asyncio.timeout(_LABEL_FETCH_TIMEOUT_S):
                self._label_value = await self._label_watcher.fetch()
        except (SharingPluginError, OSError, TimeoutError) as exc:
            log.warning("reading node %s's labels: %s", self.options.node_name, exc)
        self._tasks.spawn(self._label_watcher.run(self._on_label), name="node-label", eternal=True)

    def _start_node_status(self) -> None:
        node, client, options = self.options.node_name, self._kube_client, self.options
        reporter = None
        if node is not None and client is not None and (options.node_status or options.node_labels):
            from sharing_plugin.observability.nodestatus import NodeStatusReporter

            reporter = NodeStatusReporter(client, node)
            self._tasks.spawn(reporter.run(), name="node-status", eternal=True)
        elif options.node_labels:
            log.warning("--node-labels needs --node-name and Kubernetes credentials: off")
        self.report = NodeReport(reporter if options.node_status else None)
        self._labels = LabelPublisher(
            file=options.labels_file, reporter=reporter if options.node_labels else None
        )

    def _on_label(self, value: str | None) -> None:
        if value == self._label_value:
            return
        log.info("node label %s is now %r", self.options.config_label, value)
        self._label_value = value
        if self.source is not None:
            self.source.trigger("label changed")

    def _on_api_trouble(self, text: str | None) -> None:
        """API trouble (credentials refused, server away) shows in /status until it is over."""
        previous, self._api_trouble = self._api_trouble, text
        if text is not None:
            self.status.set_error(text)
        elif previous is not None and self.status.last_error == previous:
            self.status.set_error(None)

    async def close(self) -> None:
        if self.source is not None:
            self.source.stop()
        await self._labels.close()
        reporter = self.report.reporter
        if reporter is not None and self.options.clear_labels_on_exit:
            try:
                async with asyncio.timeout(_CLEAR_TIMEOUT_S):
                    await reporter.clear()
            except Exception as exc:
                log.warning("clearing node %s's labels: %s", reporter.node_name, exc)
        await self._tasks.close()
        await self.usage.close()
        await self.supervisor.close()
        await self.pod_resources.close()
        if self._metrics_server is not None:
            await self._metrics_server.close()
            self._metrics_server = None
        if self._own_client is not None:
            await self._own_client.close()
            self._own_client = None

    # --- reloads -----------------------------------------------------------------------------

    async def _follow_config(self) -> None:
        """Apply every config update until stopped. Whatever goes wrong on the way is logged
        and the watch taken up again: a plugin that silently stops reloading is the failure
        admins cannot see."""
        delay, limit = _FOLLOW_BACKOFF_S
        while True:
            try:
                assert self.source is not None
                async with contextlib.aclosing(self.source.updates()) as updates:
                    async for update in updates:
                        await self._on_update(update)
                        delay = _FOLLOW_BACKOFF_S[0]
                return  # the source was stopped
            except Exception:
                log.exception("following the config failed; watching again in %.1f s", delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, limit)

    async def next_update(self) -> None:
        """Return once the next config update (good or rejected) has been handled."""
        waiter = asyncio.get_running_loop().create_future()
        self._update_waiters.append(waiter)
        await waiter

    async def _on_update(self, update: ConfigUpdate | None, reapply: str = _MIG_RETRY) -> None:
        """Handle `update`; None carries out the last good config again, for `reapply`."""
        try:
            await self._handle(update, reapply)
        finally:
            waiters, self._update_waiters = self._update_waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    async def _handle(self, update: ConfigUpdate | None, reapply: str) -> None:
        async with self._reload_lock:
            if update is None:
                # Chosen under the lock, so a retry never brings back a config just replaced.
                if self._base_plan is None:
                    return
                update = ConfigUpdate(
                    name=self._config_name, loaded=self._loaded, error=None, reason=reapply
                )
            if update.error is not None:
                self._reject(update.error, update.reason)
                return
            loaded = update.loaded
            config = loaded.config if loaded else Config()
            try:
                inventory = await self._inventory_for(config)
                inventory = await self._partition(config, inventory)
                base = plan_node(config, inventory, as_is=True).plan
            except PlanError as exc:
                self._reject(self._placed(exc, loaded, update.name), update.reason)
                return
            except StartupError:
                raise
            except SharingPluginError as exc:
                self._reject(exc, update.reason)
                return
            await self._apply(loaded, update.name, inventory, base, update.reason)
            self._ensure_health_monitor(config, inventory)

    def _placed(self, error: PlanError, loaded: LoadedConfig | None, name: str | None) -> str:
        """The plan's problems at their lines in the file the admin edits, like `validate`."""
        if loaded is None or self.source is None:
            return str(error)
        return "\n".join(self.source.place(p, name) for p in error.problems)

    async def _partition(self, config: Config, inventory: Inventory) -> Inventory:
        """Make the GPUs' MIG layout match `partitioning.mig`; the node as it is afterwards."""
        assert self._layouts is not None
        inventory, changed = await self._layouts.apply(config, inventory)
        self.report.mig(self._layouts.states, inventory)
        if changed:
            self._inventory = inventory
            if self._health_monitor is not None:
                self._health_monitor.update_inventory(inventory)
        return inventory

    def _ensure_health_monitor(self, config: Config, inventory: Inventory) -> None:
        settings = self.options.health_env.settings(config.health)
        if self._health_monitor is None and not inventory.gpus:
            return  # nothing to watch (NVML absent with failOnInitError: false)
        if self._health_monitor is not None:
            self._health_monitor.update_settings(settings)
            return
        self._health_monitor = HealthMonitor(
            self.nvml,
            inventory,
            settings=settings,
            on_change=self._on_health,
            metrics=self.metrics,
        )
        self._tasks.spawn(self._health_monitor.run(), name="health", eternal=True)

    async def _on_health(self, health: Mapping[str, bool]) -> None:
        async with self._reload_lock:
            before, self._health = self._health, dict(health)
            self.report.health(before, self._health, self._inventory)
            config = self.config
            if config is None or self._base_plan is None:
                return
            await self.supervisor.apply(self._effective(config), self._context(config))

    async def _on_mps(self) -> None:
        """An MPS daemon started or stopped serving: its resource's devices follow."""
        async with self._reload_lock:
            config = self.config
            if config is None or self._base_plan is None:
                return
            await self.supervisor.apply(self._effective(config), self._context(config))

    def _reject(self, error: Exception | str, reason: str) -> None:
        lines = str(error).splitlines() or [str(error)]
        what = "config rejected" if isinstance(error, ConfigError | str) else "cannot apply config"
        fields = {"reason": reason}
        for line in lines:
            log.error("%s (%s): %s", what, reason, line, extra=fields)
        if self._loaded is not None:
            log.error(
                "keeping the last good config (generation %d)",
                self._generation,
                extra={**fields, "generation": self._generation},
            )
        self.status.set_error(lines[0] if len(lines) == 1 else "; ".join(lines))
        self.metrics.count_reload(False)
        self.report.rejected(lines[0])

    async def _inventory_for(self, config: Config) -> Inventory:
        if self._inventory is None:
            try:
                self._inventory = await asyncio.to_thread(
                    discover, self.nvml, fail_on_init_error=config.flags.fail_on_init_error
                )
            except NvmlError as exc:
                # failOnInitError means what it means in the reference plugin: the plugin does
                # not start on a node whose GPUs it cannot read (kubelet restarts it, and the
                # pod's state shows why). Raised past the config handling, out of start().
                raise StartupError(
                    f"{exc} (flags.failOnInitError is true; set it to false to start without "
                    "the GPUs that do not answer)"
                ) from exc
            for warning in self._inventory.warnings:
                log.warning("%s", warning)
            if not self._inventory.gpus and self._inventory.warnings:
                self._tasks.spawn(self._rediscover(), name="rediscover")
        return self._inventory

    async def _rediscover(self) -> None:
        """NVML did not start (failOnInitError: false): look again, less and less often, and
        serve the GPUs once it answers -- the driver may still be installing at boot."""
        delay = self.options.rediscover_s
        while True:
            await asyncio.sleep(delay)
            inventory = await asyncio.to_thread(discover, self.nvml, fail_on_init_error=False)
            if inventory.gpus:
                log.info("NVML answers now: %d GPU(s) found", len(inventory.gpus))
                self._inventory = inventory
                await self._on_update(None, reapply=_REDISCOVERED)
                return
            delay = min(delay * 2, _REDISCOVER_MAX_S)

    async def _apply(
        self,
        loaded: LoadedConfig | None,
        name: str | None,
        inventory: Inventory,
        base: Plan,
        reason: str,
    ) -> None:
        config = loaded.config if loaded else Config()
        same = (
            self._loaded is not None
            and loaded is not None
            and self._loaded.source_hash == loaded.source_hash
            and self._config_name == name
        )
        self._loaded = loaded
        self._config_name = name
        self._base_plan = base
        if not same:
            self._generation += 1
            for warning in (*(loaded.warnings if loaded else ()), *base.warnings):
                log.warning("config: %s", warning, extra={"generation": self._generation})
            for note in loaded.notes if loaded else ():
                log.info("config: %s", note, extra={"generation": self._generation})
        retry = reason in _REAPPLY
        if not retry:  # a retry is no reload: it must not clear lastError nor count as one
            self.status.set_config(
                name=name,
                hash=loaded.source_hash if loaded else "",
                generation=self._generation,
            )
            self.metrics.count_reload(True)
            self.metrics.set_config(
                name=name,
                hash_=loaded.source_hash if loaded else "",
                generation=self._generation,
            )
            self.report.applied(
                name=name,
                hash_=loaded.source_hash if loaded else "",
                generation=self._generation,
                plan=base,
            )
        self.mps.follow(base.mps)
        self.usage.follow(
            plan=base, inventory=inventory, over_share_s=config.usage.over_share_seconds
        )
        change = await self.supervisor.apply(self._effective(config), self._context(config))
        await self._labels.publish(config, inventory, base)
        log.log(
            logging.DEBUG if retry and change.empty else logging.INFO,
            "config %s applied (%s, generation %d): %s",
            name or (loaded.file if loaded else "<default>"),
            reason,
            self._generation,
            change.describe(),
            extra={
                "config": name or "",
                "hash": loaded.source_hash if loaded else "",
                "generation": self._generation,
                "reason": reason,
            },
        )

    def _effective(self, config: Config) -> Plan:
        assert self._base_plan is not None
        plan = self._base_plan
        if self.options.health_env.settings(config.health).enabled:
            plan = plan.with_health(self._health)
        return self.mps.gate(plan)

    def _context(self, config: Config) -> AllocateContext:
        return AllocateContext(
            flags=config.flags,
            inventory=self._inventory,
            control_nodes=_present(CONTROL_DEVICE_NODES, config.flags.nvidia_dev_root),
        )

    @property
    def config(self) -> Config | None:
        return self._loaded.config if self._loaded else None

    @property
    def health_monitor(self) -> HealthMonitor | None:
        """The GPU health monitor, once a first config has been applied."""
        return self._health_monitor

    @property
    def health(self) -> Mapping[str, bool]:
        return dict(self._health)


def _present(nodes: tuple[str, ...], dev_root: str) -> tuple[str, ...]:
    """The control device nodes that exist under `dev_root` (the reference stats each one)."""
    root = Path(dev_root)
    return tuple(n for n in nodes if (root / n.lstrip("/")).exists())
