"""`run-dra`: the same config served as a DRA kubelet plugin (docs/contract.md, "DRA mode").

    async with DraDaemon(options, nvml=backend_from_spec(options.run.gpus)) as daemon:
        await daemon.wait_stopped()      # until request_stop() (SIGTERM/SIGINT) is called

Start order: the API (credentials, then which resource.k8s.io version the server serves), the
config (file, mounted ConfigMap, ConfigMap through the API, node label), the GPUs and the plan
(the same `plan_node` as `run` and `plan`), the DRA socket and the registration socket, then the
tasks that follow the config, publish the pool and watch GPU health.

The pool is a value recomputed from three inputs: the plan (config and GPUs), GPU health, and the
devices prepared claims hold. Any change marks it dirty and one publishing task writes the
newest pool (intermediate states are skipped; a failed write is retried with backoff), so a
burst of reloads or health events never races two writers. Held devices the plan dropped stay
published until their claim is unprepared (the draining rule); an unhealthy GPU's devices leave
the pool at once. After every registration the kubelet confirms, the pool is written again even
if unchanged: the kubelet deletes a driver's slices when the driver goes away.

`partitioning.mig` is not applied here: MIG devices are served as they are (`run` applies layouts).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sharing_plugin.config.loader import LoadedConfig
from sharing_plugin.config.model import Config
from sharing_plugin.daemon.dra_pool import PoolKeeper
from sharing_plugin.daemon.health_monitor import HealthMonitor
from sharing_plugin.daemon.kube import ConfigFedService, api_client, config_feed
from sharing_plugin.daemon.options import RunOptions
from sharing_plugin.daemon.tasks import TaskOwner
from sharing_plugin.dra.cdi import CdiSpecDir
from sharing_plugin.dra.checkpoint import CHECKPOINT_FILE, Checkpoint
from sharing_plugin.dra.claims import ApiClaimReader
from sharing_plugin.dra.prepare import ClaimPreparer, PoolState
from sharing_plugin.dra.resources import discover_version
from sharing_plugin.dra.server import DraPluginServer, plugin_dir
from sharing_plugin.dra.slices import SlicePublisher
from sharing_plugin.errors import KubeApiError, PlanError, SharingPluginError, StartupError
from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.nvml.api import NvmlApi
from sharing_plugin.nvml.discover import discover
from sharing_plugin.observability.http_server import MetricsServer
from sharing_plugin.observability.metrics import Metrics
from sharing_plugin.observability.status import StatusBoard
from sharing_plugin.plan.model import Plan
from sharing_plugin.plan.node import plan_node
from sharing_plugin.sources.filewatch import ConfigUpdate
from sharing_plugin.sources.nodelabel import NodeLabelWatcher
from sharing_plugin.views.dra import DEFAULT_DRIVER, PublishedDevice, dra_devices

if TYPE_CHECKING:
    from lightkube import AsyncClient

log = logging.getLogger(__name__)

_LABEL_FETCH_TIMEOUT_S = 5.0
_CLEAR_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class DraOptions:
    """What `sharing-plugin run-dra` takes: `run`'s config sources, plus the driver's own."""

    run: RunOptions = field(default_factory=RunOptions)
    driver_name: str = DEFAULT_DRIVER
    cdi_dir: Path = Path("/var/run/cdi")
    clear_slices_on_exit: bool = False
    publish_backoff_s: tuple[float, float] = (0.2, 10.0)


class DraDaemon(ConfigFedService):
    """One running DRA kubelet plugin; an async context manager that starts in order."""

    def __init__(
        self, options: DraOptions, *, nvml: NvmlApi, kube_client: AsyncClient | None = None
    ) -> None:
        super().__init__()
        self.options = options
        self.nvml = nvml
        self.metrics = Metrics()
        self.status = StatusBoard()
        self._kube_client = kube_client
        self._own_client: AsyncClient | None = None
        self._tasks = TaskOwner("dra")
        self._reload_lock = asyncio.Lock()
        self._label_value: str | None = None
        self._loaded: LoadedConfig | None = None
        self._config_name: str | None = None
        self._generation = 0
        self._inventory: Inventory | None = None
        self._base: Plan | None = None
        self._health: dict[str, bool] = {}
        self._health_monitor: HealthMonitor | None = None
        self._metrics_server: MetricsServer | None = None
        self.preparer: ClaimPreparer | None = None
        self.keeper: PoolKeeper | None = None
        self.server: DraPluginServer | None = None

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        run, driver = self.options.run, self.options.driver_name
        node = run.node_name
        if node is None:
            raise StartupError("run-dra needs --node-name (NODE_NAME): the pool is the node's")
        if run.metrics_address is not None:
            self._metrics_server = MetricsServer(*run.metrics_address, self.metrics, self.status)
            await self._metrics_server.start()
        client = self._kube_client
        if client is None:
            client = self._kube_client = self._own_client = api_client(run)
        if client is None:
            raise StartupError("run-dra needs the Kubernetes API to publish ResourceSlices")
        try:
            version = await discover_version(client)
        except KubeApiError as exc:
            raise StartupError(str(exc)) from exc
        log.info("DRA driver %s on node %s speaks %s", driver, node, version)
        await self._start_label_watch(client, node)
        self.source = config_feed(
            run, client, label_value=lambda: self._label_value, on_trouble=self.status.set_error
        )
        self.preparer = ClaimPreparer(
            driver=driver,
            pool=node,
            claims=ApiClaimReader(client, version),
            specs=CdiSpecDir(self.options.cdi_dir),
            checkpoint=Checkpoint(plugin_dir(run.kubelet_dir, driver) / CHECKPOINT_FILE),
            state=lambda: self.keeper.state if self.keeper else None,
            on_change=lambda: self.keeper.changed() if self.keeper else None,
        )
        self.keeper = PoolKeeper(
            SlicePublisher(client, driver=driver, node_name=node, api_version=version),
            held=self.preparer.held,
            status=self.status,
            registered=lambda: self.server is not None and self.server.registered,
            backoff_s=self.options.publish_backoff_s,
        )
        await self._on_update(await self.source.start())
        self.server = DraPluginServer(
            kubelet_dir=run.kubelet_dir,
            driver=driver,
            preparer=self.preparer,
            on_registered=self.keeper.registered,
        )
        await self.server.start()
        self._tasks.spawn(self.keeper.run(), name="publish", eternal=True)
        self._tasks.spawn(self._follow_config(), name="config", eternal=True)

    async def _start_label_watch(self, client: AsyncClient, node: str) -> None:
        watcher = NodeLabelWatcher(
            node,
            label=self.options.run.config_label,
            client=client,
            on_trouble=self.status.set_error,
        )
        try:
            async with asyncio.timeout(_LABEL_FETCH_TIMEOUT_S):
                self._label_value = await watcher.fetch()
        except (SharingPluginError, OSError, TimeoutError) as exc:
            log.warning("reading node %s's labels: %s", node, exc)
        self._tasks.spawn(watcher.run(self._on_label), name="node-label", eternal=True)

    def _on_label(self, value: str | None) -> None:
        if value != self._label_value:
            self._label_value = value
            if self.source is not None:
                self.source.trigger("label changed")

    async def close(self) -> None:
        if self.source is not None:
            self.source.stop()
        await self._tasks.close()
        if self.server is not None:
            await self.server.stop()
        if self.options.clear_slices_on_exit and self.keeper is not None:
            try:
                async with asyncio.timeout(_CLEAR_TIMEOUT_S):
                    await self.keeper.publisher.clear()
            except (KubeApiError, TimeoutError) as exc:
                log.warning("removing the ResourceSlices at exit: %s", exc)
        if self._metrics_server is not None:
            await self._metrics_server.close()
            self._metrics_server = None
        if self._own_client is not None:
            await self._own_client.close()
            self._own_client = None

    # --- the config --------------------------------------------------------------------------

    async def _follow_config(self) -> None:
        """Apply every config update until stopped; a failure is logged and the watch taken up
        again, since a plugin that silently stops reloading is what admins cannot see."""
        low, high = self.options.publish_backoff_s
        delay = low
        while True:
            try:
                assert self.source is not None
                async with contextlib.aclosing(self.source.updates()) as updates:
                    async for update in updates:
                        await self._on_update(update)
                        delay = low
                return  # the source was stopped
            except Exception:
                log.exception("following the config failed; watching again in %.1f s", delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, high)

    async def _on_update(self, update: ConfigUpdate) -> None:
        async with self._reload_lock:
            if update.error is not None:
                self._reject(str(update.error), update.reason)
                return
            config = update.loaded.config if update.loaded else Config()
            try:
                inventory = await self._inventory_for(config)
                base = plan_node(config, inventory, as_is=True).plan
                state = self._pool_state(config, base, inventory)
            except PlanError as exc:
                source = self.source
                placed = [source.place(p, update.name) for p in exc.problems] if source else []
                self._reject("\n".join(placed) or str(exc), update.reason)
                return
            except StartupError:
                raise
            except SharingPluginError as exc:
                self._reject(str(exc), update.reason)
                return
            if config.partitioning is not None and config.partitioning.mig:
                log.warning("run-dra does not apply partitioning.mig: MIG devices are served as is")
            loaded = update.loaded
            same = (
                loaded is not None
                and self._loaded is not None
                and (loaded.source_hash, update.name)
                == (self._loaded.source_hash, self._config_name)
            )
            if not same:
                self._generation += 1
            self._loaded, self._config_name, self._base = loaded, update.name, base
            assert self.keeper is not None
            self.keeper.set_state(state)
            self.status.set_config(
                name=update.name,
                hash=loaded.source_hash if loaded else "",
                generation=self._generation,
            )
            self.metrics.count_reload(True)
            log.info(
                "config %s applied (%s, generation %d): %d DRA device(s)",
                update.name or (loaded.file if loaded else "<default>"),
                update.reason,
                self._generation,
                len(state.devices),
            )
            self._ensure_health_monitor(config, inventory)

    def _reject(self, error: str, reason: str) -> None:
        for line in error.splitlines() or [error]:
            log.error("config rejected (%s): %s", reason, line)
        if self._loaded is not None:
            log.error("keeping the last good config (generation %d)", self._generation)
        self.status.set_error("; ".join(error.splitlines()) or error)
        self.metrics.count_reload(False)

    def _pool_state(self, config: Config, base: Plan, inventory: Inventory) -> PoolState:
        plan = base
        if self.options.run.health_env.settings(config.health).enabled:
            plan = base.with_health(self._health)
        devices = {d.name: d for d in dra_devices(plan, inventory)}
        return PoolState(devices=devices, plan=plan, flags=config.flags)

    async def _inventory_for(self, config: Config) -> Inventory:
        if self._inventory is None:
            try:
                self._inventory = await asyncio.to_thread(
                    discover, self.nvml, fail_on_init_error=config.flags.fail_on_init_error
                )
            except SharingPluginError as exc:
                raise StartupError(str(exc)) from exc
            for warning in self._inventory.warnings:
                log.warning("%s", warning)
        return self._inventory

    # --- health ------------------------------------------------------------------------------

    def _ensure_health_monitor(self, config: Config, inventory: Inventory) -> None:
        settings = self.options.run.health_env.settings(config.health)
        if self._health_monitor is not None:
            self._health_monitor.update_settings(settings)
            return
        if not inventory.gpus:
            return
        self._health_monitor = HealthMonitor(
            self.nvml, inventory, settings=settings, on_change=self._on_health, metrics=self.metrics
        )
        self._tasks.spawn(self._health_monitor.run(), name="health", eternal=True)

    async def _on_health(self, health: Mapping[str, bool]) -> None:
        async with self._reload_lock:
            self._health = dict(health)
            if self._base is None or self._inventory is None:
                return
            config = self._loaded.config if self._loaded else Config()
            if self.keeper is not None:
                self.keeper.set_state(self._pool_state(config, self._base, self._inventory))

    @property
    def health_monitor(self) -> HealthMonitor | None:
        """The GPU health monitor, once a config with GPUs has been applied."""
        return self._health_monitor

    # --- publishing --------------------------------------------------------------------------

    def pool(self) -> tuple[PublishedDevice, ...]:
        """What the pool should hold now (see `PoolKeeper.pool`)."""
        return self.keeper.pool() if self.keeper is not None else ()

    async def wait_published(
        self,
        predicate: Callable[[tuple[PublishedDevice, ...]], bool],
        timeout: float = 5.0,  # noqa: ASYNC109
    ) -> tuple[PublishedDevice, ...]:
        """What was published, once it satisfies `predicate` (TimeoutError otherwise)."""
        assert self.keeper is not None
        return await self.keeper.wait_published(predicate, timeout)
