"""The values the node pipeline hands its consumers and publishes: `Applied` or `Rejected`,
and the `NodeView` a consumer serves.

Every config update (a read of the config, or the last good one carried out again on a changed
node) ends in exactly one of them. Consumers (`run`'s device plugin, `run-dra`'s pool, the MPS
controller) are handed a `NodeView` of each `Applied`, and again whenever the node changes under
it, so that they never ask the pipeline for its state; both outcomes are published to whoever
subscribed (`Outcomes`), which is how tests wait for an update to be handled instead of polling
the daemon's state.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass

from sharing_plugin.config.loader import LoadedConfig
from sharing_plugin.config.model import Config
from sharing_plugin.errors import Problem
from sharing_plugin.gpus.health_tracker import Fault
from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.plan.model import Plan
from sharing_plugin.sources.update import Trigger


@dataclass(frozen=True, slots=True)
class Applied:
    """A good config planned on the node: what consumers serve.

    `loaded` is None for the default config (no config given); `plan` is the node as it is now
    (no placeholder for a MIG instance yet to be created); `generation` counts the distinct
    configs applied (a re-read of the same text, or a re-apply, keeps it).
    """

    config: Config
    loaded: LoadedConfig | None
    name: str | None
    inventory: Inventory
    plan: Plan
    generation: int
    trigger: Trigger

    @property
    def source_hash(self) -> str:
        return self.loaded.source_hash if self.loaded else ""

    @property
    def shown_name(self) -> str:
        """How logs name this config: its name, else its file, else `<default>`."""
        return self.name or (self.loaded.file if self.loaded else "<default>")


@dataclass(frozen=True, slots=True)
class NodeView:
    """The node for the change at hand, as a consumer serves it: the `Applied` config, its plan
    with GPU health applied, and the node's GPUs and faults as they are now.

    `plan` is `applied.plan` with the devices of Unhealthy GPUs marked, when health checks are on
    for its config; `unhealthy` holds those GPU and MIG UUIDs (empty when health checks are off).
    `inventory` may be newer than `applied.inventory` (a MIG instance made or destroyed for a DRA
    claim since). `faults` says why each Unhealthy device is so, as the health watch last said.
    """

    applied: Applied
    plan: Plan
    inventory: Inventory
    unhealthy: frozenset[str]
    faults: Mapping[str, Fault]


@dataclass(frozen=True, slots=True)
class Rejected:
    """An update that changed nothing: the last good config (if any) keeps serving.

    `problems` are placed (`FILE:LINE:COL: path: message` where the entry is written);
    `config_fault` is True when the config itself (or its fit to the node) is wrong, False
    when it is fine but the node could not be brought to it (a MIG call failed).
    """

    problems: tuple[Problem, ...]
    trigger: Trigger
    config_fault: bool = True

    def lines(self) -> list[str]:
        return [str(p) for p in self.problems] or ["invalid config"]


Outcome = Applied | Rejected


@dataclass(frozen=True, slots=True)
class Served:
    """What a consumer did with an `Applied`, for the pipeline's log line."""

    summary: str
    changed: bool = True


class Outcomes:
    """The outcomes published while this subscription lasts, in order. Subscribe before
    causing the change you wait for."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[Outcome] = asyncio.Queue()

    def put(self, outcome: Outcome) -> None:
        self._queue.put_nowait(outcome)

    async def next(self, timeout: float = 5.0) -> Outcome:  # noqa: ASYNC109
        """The next outcome; TimeoutError if none comes within `timeout` seconds."""
        async with asyncio.timeout(timeout):
            return await self._queue.get()
