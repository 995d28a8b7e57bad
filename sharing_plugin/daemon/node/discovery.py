"""The node's GPUs as the pipeline plans them: found once, found again when the driver comes.

NVML is read once (in a worker thread: it blocks) and the inventory kept; a MIG layout change
replaces it. When NVML did not answer at start and `flags.failOnInitError` is false, the node
is served without GPUs, and discovery looks again, less and less often, until NVML answers: the
NVIDIA driver is often still installing when the DaemonSet's pod starts at boot. With
`failOnInitError` true the command does not start, as in the reference plugin (kubelet
restarts the pod, and its state shows why).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from sharing_plugin.config.model import Config
from sharing_plugin.errors import NvmlError, StartupError
from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.kit.tasks import TaskOwner
from sharing_plugin.nvml.api import NvmlApi
from sharing_plugin.nvml.discover import discover

log = logging.getLogger(__name__)

REDISCOVER_MAX_S = 300.0


class GpuDiscovery:
    """The inventory to plan on; `found` is awaited once NVML answers after a GPU-less start."""

    def __init__(
        self,
        nvml: NvmlApi,
        *,
        tasks: TaskOwner,
        found: Callable[[], Awaitable[None]],
        first_delay_s: float,
    ) -> None:
        self._nvml = nvml
        self._tasks = tasks
        self._found = found
        self._first_delay_s = first_delay_s
        self.inventory: Inventory | None = None

    async def inventory_for(self, config: Config) -> Inventory:
        """The node's GPUs (discovered on first use). Raises StartupError when NVML does not
        answer and `config.flags.failOnInitError` is true."""
        if self.inventory is not None:
            return self.inventory
        try:
            inventory = await asyncio.to_thread(
                discover, self._nvml, fail_on_init_error=config.flags.fail_on_init_error
            )
        except NvmlError as exc:
            raise StartupError(
                f"{exc} (flags.failOnInitError is true; set it to false to start without "
                "the GPUs that do not answer)"
            ) from exc
        for warning in inventory.warnings:
            log.warning("%s", warning)
        self.inventory = inventory
        if not inventory.gpus and inventory.warnings:
            self._tasks.spawn(self._rediscover(), name="rediscover")
        return inventory

    async def _rediscover(self) -> None:
        delay = self._first_delay_s
        while True:
            await asyncio.sleep(delay)
            inventory = await asyncio.to_thread(discover, self._nvml, fail_on_init_error=False)
            if inventory.gpus:
                log.info("NVML answers now: %d GPU(s) found", len(inventory.gpus))
                self.inventory = inventory
                await self._found()
                return
            delay = min(delay * 2, REDISCOVER_MAX_S)
