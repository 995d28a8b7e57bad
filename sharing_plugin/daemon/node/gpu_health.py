"""GPU health as the node pipeline keeps it, and the `NodeView` its consumers are handed.

The health monitor is started once a config with GPUs has been applied (there is nothing to
watch before), follows each config's `health` section, and reports every change of the mapping
(GPU or MIG UUID -> Healthy) with the fault behind each Unhealthy device. What a consumer serves
is the last `Applied` with that health applied: its view is built here, once per change, so no
consumer reads the pipeline's health back. Health checks turned off in a config leave its plan
as planned, whatever the monitor last said.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import MappingProxyType

from sharing_plugin.config.model import Config
from sharing_plugin.daemon.node.health_monitor import HealthEnv, HealthMonitor, OnChange
from sharing_plugin.daemon.node.outcome import Applied, NodeView
from sharing_plugin.gpus.health_tracker import Fault
from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.kit.tasks import TaskOwner
from sharing_plugin.nvml.api import NvmlApi
from sharing_plugin.observability.metrics import Metrics

log = logging.getLogger(__name__)


class NodeHealth:
    """The node's GPU health (`env` None: the command watches none; everything is Healthy)."""

    def __init__(
        self,
        env: HealthEnv | None,
        *,
        nvml: NvmlApi,
        metrics: Metrics | None,
        tasks: TaskOwner,
        on_change: OnChange,
    ) -> None:
        self._env = env
        self._nvml = nvml
        self._metrics = metrics
        self._tasks = tasks
        self._on_change = on_change
        self._health: dict[str, bool] = {}
        self._faults: dict[str, Fault] = {}
        self.monitor: HealthMonitor | None = None
        """The GPU health monitor, once a config with GPUs has been applied."""

    def log_settings(self) -> None:
        """Say once, at start, what the environment asks of health checks."""
        if self._env is None:
            return
        if described := self._env.describe():
            log.info("health checks: %s", described)
        for problem in self._env.problems:
            log.warning("health checks: %s", problem)

    @property
    def health(self) -> Mapping[str, bool]:
        """GPU and MIG UUID -> Healthy, as the monitor last reported (absent: Healthy)."""
        return dict(self._health)

    @property
    def faults(self) -> Mapping[str, Fault]:
        """GPU and MIG UUID -> why it is Unhealthy, for the Unhealthy ones of `health`."""
        return dict(self._faults)

    def record(self, health: Mapping[str, bool]) -> Mapping[str, bool]:
        """The monitor's new mapping (and its faults) kept; the mapping before."""
        before, self._health = self._health, dict(health)
        self._faults = dict(self.monitor.faults) if self.monitor is not None else {}
        return before

    def follow(self, config: Config, inventory: Inventory) -> None:
        """Watch `inventory`'s GPUs with `config`'s health settings (the monitor starts with
        the first config applied on GPUs; later ones update its settings)."""
        if self._env is None:
            return
        settings = self._env.settings(config.health)
        if self.monitor is not None:
            self.monitor.update_settings(settings)
            return
        if not inventory.gpus:
            return  # nothing to watch (no GPUs yet, or NVML absent with failOnInitError: false)
        self.monitor = HealthMonitor(
            self._nvml,
            inventory,
            settings=settings,
            on_change=self._on_change,
            metrics=self._metrics,
        )
        self._tasks.spawn(self.monitor.run(), name="health", eternal=True)

    def inventory_changed(self, inventory: Inventory) -> None:
        """Health events on new MIG devices are attributed to them from now on."""
        if self.monitor is not None:
            self.monitor.update_inventory(inventory)

    def view(self, applied: Applied, inventory: Inventory) -> NodeView:
        """What a consumer serves of `applied` on the node as `inventory` says it is now."""
        checked = self._env is not None and self._env.settings(applied.config.health).enabled
        return NodeView(
            applied=applied,
            plan=applied.plan.with_health(self._health) if checked else applied.plan,
            inventory=inventory,
            unhealthy=frozenset(u for u, ok in self._health.items() if not ok)
            if checked
            else frozenset(),
            faults=MappingProxyType(dict(self._faults)),
        )
