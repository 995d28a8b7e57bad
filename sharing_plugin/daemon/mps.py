"""`mps-control`: one MPS control daemon per MPS resource of the config, kept in step with it.

    async with MpsController(options, nvml=backend_from_spec(...), control=ControlBinary(...)):
        ...                                   # until SIGTERM

The config comes from the same sources as `run` (file, mounted ConfigMap, the ConfigMap through
the API, the node label), validated and planned the same way, so both containers of the pod
agree on which resources are MPS and over which GPUs; the plan's `MpsDaemon` values say what
each daemon must be. A reload compares them with the running ones by fingerprint (GPUs and
limits): an unchanged daemon is left alone, a new one started, and a changed or removed one
replaced or stopped only once no pod holds a replica of its resource (kubelet's PodResources,
as for draining in `run`), because stopping a daemon kills its clients. Until then it keeps
serving with its old limits and its state file says it is waiting, with why.

Stopping `mps-control` leaves the daemons running: the next `mps-control` adopts them, and the
plugin stops vouching for them once their state file is no longer confirmed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sharing_plugin.config.model import Config
from sharing_plugin.daemon.kube import ConfigFedService, api_client, config_feed, needs_api
from sharing_plugin.daemon.mps_keeper import DaemonKeeper, KeeperTiming
from sharing_plugin.daemon.options import RunOptions
from sharing_plugin.daemon.tasks import TaskOwner
from sharing_plugin.errors import NvmlError, PlanError, SharingPluginError
from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.kubelet.podresources import PodResourcesClient
from sharing_plugin.mps import MpsControl
from sharing_plugin.nvml.api import NvmlApi
from sharing_plugin.nvml.discover import discover
from sharing_plugin.plan.mps import MpsDaemon
from sharing_plugin.plan.node import plan_node
from sharing_plugin.sources.filewatch import ConfigUpdate
from sharing_plugin.sources.nodelabel import NodeLabelWatcher

if TYPE_CHECKING:
    from lightkube import AsyncClient

log = logging.getLogger(__name__)

_FOLLOW_BACKOFF_S = (0.2, 10.0)


@dataclass(frozen=True, slots=True)
class MpsControlOptions:
    """What `sharing-plugin mps-control` was asked to do."""

    source: RunOptions = field(default_factory=RunOptions)  # config sources, GPUs, kubelet dir
    control_bin: str = "nvidia-cuda-mps-control"
    timing: KeeperTiming = field(default_factory=KeeperTiming)
    recheck_s: float = 2.0  # how often PodResources is asked while a change waits for pods


@dataclass(slots=True)
class _Kept:
    keeper: DaemonKeeper
    task: asyncio.Task[Any]


class MpsController(ConfigFedService):
    """The `mps-control` process: config in, one supervised control daemon per MPS resource."""

    def __init__(
        self,
        options: MpsControlOptions,
        *,
        nvml: NvmlApi,
        control: MpsControl,
        kube_client: AsyncClient | None = None,
    ) -> None:
        super().__init__()
        self.options = options
        self.nvml = nvml
        self.control = control
        self._kube_client = kube_client
        self._own_client: AsyncClient | None = None
        self._tasks = TaskOwner("mps-control")
        self._keepers: dict[str, _Kept] = {}
        self._wanted: dict[str, MpsDaemon] = {}
        self._inventory: Inventory | None = None
        self._label_value: str | None = None
        self._lock = asyncio.Lock()
        self._recheck: asyncio.Task[Any] | None = None
        self.pod_resources = PodResourcesClient(options.source.kubelet_dir)
        self._update_waiters: list[asyncio.Future[None]] = []

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        source = self.options.source
        if self._kube_client is None and needs_api(source):
            self._kube_client = self._own_client = api_client(source)
        if source.node_name is not None and self._kube_client is not None:
            watcher = NodeLabelWatcher(
                source.node_name, label=source.config_label, client=self._kube_client
            )
            with contextlib.suppress(SharingPluginError, OSError, TimeoutError):
                async with asyncio.timeout(5.0):
                    self._label_value = await watcher.fetch()
            self._tasks.spawn(watcher.run(self._on_label), name="node-label", eternal=True)
        self.source = config_feed(
            source,
            self._kube_client,
            label_value=lambda: self._label_value,
            on_trouble=lambda text: log.warning("%s", text) if text else None,
        )
        await self._on_update(await self.source.start())
        self._tasks.spawn(self._follow_config(), name="config", eternal=True)

    async def close(self) -> None:
        """Stop supervising; the daemons keep running for the next `mps-control` to adopt."""
        if self.source is not None:
            self.source.stop()
        await self._tasks.close()
        self._keepers.clear()
        await self.pod_resources.close()
        if self._own_client is not None:
            await self._own_client.close()
            self._own_client = None

    def _on_label(self, value: str | None) -> None:
        if value != self._label_value:
            self._label_value = value
            if self.source is not None:
                self.source.trigger("label changed")

    # --- what tests and the entry read -------------------------------------------------------

    @property
    def keepers(self) -> dict[str, DaemonKeeper]:
        return {name: kept.keeper for name, kept in self._keepers.items()}

    async def next_update(self) -> None:
        """Return once the next config update (good or rejected) has been handled."""
        waiter = asyncio.get_running_loop().create_future()
        self._update_waiters.append(waiter)
        await waiter

    # --- config ------------------------------------------------------------------------------

    async def _follow_config(self) -> None:
        delay, limit = _FOLLOW_BACKOFF_S
        while True:
            try:
                assert self.source is not None
                async with contextlib.aclosing(self.source.updates()) as updates:
                    async for update in updates:
                        await self._on_update(update)
                        delay = _FOLLOW_BACKOFF_S[0]
                return
            except Exception:
                log.exception("following the config failed; watching again in %.1f s", delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, limit)

    async def _on_update(self, update: ConfigUpdate) -> None:
        try:
            wanted = await self._daemons_for(update)
            if wanted is not None:
                async with self._lock:
                    self._wanted = wanted
                await self._reconcile()
        finally:
            waiters, self._update_waiters = self._update_waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    async def _daemons_for(self, update: ConfigUpdate) -> dict[str, MpsDaemon] | None:
        """The daemons the update's config wants; None when it is rejected (nothing changes)."""
        if update.error is not None:
            for line in str(update.error).splitlines():
                log.error("config rejected (%s): %s", update.reason, line)
            return None
        config = update.loaded.config if update.loaded else Config()
        try:
            inventory = await self._inventory_for(config)
            plan = plan_node(config, inventory, as_is=True).plan
        except PlanError as exc:
            for problem in exc.problems:
                text = self.source.place(problem, update.name) if self.source else str(problem)
                log.error("config rejected (%s): %s", update.reason, text)
            return None
        except NvmlError as exc:
            log.error("cannot read the GPUs: %s", exc)
            return None
        log.info(
            "config %s (%s): MPS daemons for %s",
            update.name or (update.loaded.file if update.loaded else "<default>"),
            update.reason,
            ", ".join(d.resource for d in plan.mps) or "no resource",
        )
        return {d.resource: d for d in plan.mps}

    async def _inventory_for(self, config: Config) -> Inventory:
        if self._inventory is None:
            self._inventory = await asyncio.to_thread(
                discover, self.nvml, fail_on_init_error=config.flags.fail_on_init_error
            )
        return self._inventory

    # --- daemons -----------------------------------------------------------------------------

    async def _reconcile(self) -> None:
        """Bring the running daemons in line with `_wanted`, sparing daemons pods still use."""
        async with self._lock:
            held: dict[str, frozenset[str]] | None = None
            waiting = False
            for name in sorted({*self._wanted, *self._keepers}):
                want = self._wanted.get(name)
                kept = self._keepers.get(name)
                if (
                    kept is not None
                    and want is not None
                    and kept.keeper.spec.fingerprint == want.fingerprint
                ):
                    kept.keeper.set_waiting(None)
                    continue
                if kept is None:
                    assert want is not None
                    self._keep(want)
                    continue
                if held is None:
                    held = await self.pod_resources.held_devices() or {}
                holders = len(held.get(name, ()))
                if holders:
                    what = "new GPUs or limits" if want is not None else "stopping the daemon"
                    kept.keeper.set_waiting(
                        f"{what} waits until pods release the {holders} replica(s) they hold"
                    )
                    waiting = True
                    continue
                await self._drop(name, retire=want is None)
                if want is not None:
                    self._keep(want)
            if waiting:
                self._schedule_recheck()

    def _keep(self, spec: MpsDaemon) -> None:
        keeper = DaemonKeeper(spec, control=self.control, timing=self.options.timing)
        task = self._tasks.spawn(keeper.run(), name=f"mps:{spec.resource}", eternal=True)
        self._keepers[spec.resource] = _Kept(keeper, task)

    async def _drop(self, name: str, *, retire: bool) -> None:
        kept = self._keepers.pop(name)
        kept.task.cancel()
        await asyncio.wait([kept.task])
        if retire:
            await kept.keeper.retire()
        # A replaced daemon is stopped by its successor, which finds it in the pipe directory.

    def _schedule_recheck(self) -> None:
        if self._recheck is None or self._recheck.done():
            self._recheck = self._tasks.spawn(self._recheck_later(), name="mps-recheck")

    async def _recheck_later(self) -> None:
        await asyncio.sleep(self.options.recheck_s)
        self._recheck = None
        await self._reconcile()
