"""Publishing the node's GFD-compatible labels, to every destination asked for, through one seam.

After every applied config (a reload, a MIG layout change, GPUs found) the labels of the node
as it now advertises are computed from the plan, the same function `plan --format labels`
prints, and handed to each `LabelSink`: the NFD feature file (`--labels-file`, written
atomically, removed at exit), the Node itself (`--node-labels on`, merge-patched, only the keys
this plugin owns) and NFD's `NodeFeature` object (`flags.useNodeFeatureAPI: true` in the
config, removed with `--clear-labels-on-exit on`). A sink the config turns off is withdrawn
(its labels taken back) and published again when turned on. A sink is handed labels only when
they differ from what it was last handed; a sink whose write failed is handed them again at
the next change.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from sharing_plugin.config.model import Config
from sharing_plugin.errors import SharingPluginError
from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.plan.model import Plan

if TYPE_CHECKING:
    from sharing_plugin.observability.labels_file import LabelsFile
    from sharing_plugin.observability.nodefeature import NodeFeatureWriter
    from sharing_plugin.observability.nodestatus import NodeStatusReporter

log = logging.getLogger(__name__)

_SETTLE_TIMEOUT_S = 1.0


class LabelSink(Protocol):
    """One destination of the node's labels."""

    name: str

    def wanted(self, config: Config) -> bool:
        """Whether `config` asks for labels here (False: withdraw what is there)."""
        ...

    async def write(self, labels: Mapping[str, str]) -> None:
        """Make the destination hold `labels`; a failure raises `SharingPluginError`."""
        ...

    async def withdraw(self) -> None:
        """Take the labels back (the config turned this destination off)."""
        ...

    async def close(self, *, clear: bool) -> None:
        """At exit: take back what the destination's contract says goes with the plugin
        (`clear`: --clear-labels-on-exit on)."""
        ...


class FileSink:
    """The NFD local feature file: written whole, removed at exit whatever `clear` says."""

    name = "labels file"

    def __init__(self, path: Path) -> None:
        from sharing_plugin.observability.labels_file import LabelsFile

        self._file: LabelsFile = LabelsFile(path)

    def wanted(self, config: Config) -> bool:
        return True

    async def write(self, labels: Mapping[str, str]) -> None:
        await asyncio.to_thread(self._file.write, labels)

    async def withdraw(self) -> None:
        await asyncio.to_thread(self._file.remove)

    async def close(self, *, clear: bool) -> None:
        await self.withdraw()


class NodeLabelsSink:
    """The Node's own labels, through the node status reporter's queue (it never waits)."""

    name = "node labels"

    def __init__(self, reporter: NodeStatusReporter) -> None:
        self._reporter = reporter

    def wanted(self, config: Config) -> bool:
        return True

    async def write(self, labels: Mapping[str, str]) -> None:
        self._reporter.labels(labels)

    async def withdraw(self) -> None:
        self._reporter.labels({})

    async def close(self, *, clear: bool) -> None:
        """The Node keeps its labels: they still describe its GPUs while no plugin runs."""


class NodeFeatureSink:
    """NFD's `NodeFeature` object of this node, while the config asks for it."""

    name = "NodeFeature"

    def __init__(self, writer: NodeFeatureWriter | None, *, missing: str = "") -> None:
        self._writer = writer
        self._missing = missing  # why there is no writer

    def wanted(self, config: Config) -> bool:
        return bool(config.flags.use_node_feature_api)

    async def write(self, labels: Mapping[str, str]) -> None:
        if self._writer is None:
            raise SharingPluginError(self._missing)
        self._writer.publish(labels)

    async def withdraw(self) -> None:
        if self._writer is not None:
            self._writer.withdraw()

    async def close(self, *, clear: bool) -> None:
        # Without `clear` the object stays; its owner is the pod, so it goes with the pod.
        if self._writer is None:
            return
        if clear:
            self._writer.withdraw()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_SETTLE_TIMEOUT_S):
                await self._writer.settled()


class LabelPublisher:
    """Publishes the labels of each applied plan to its sinks (see the module doc)."""

    def __init__(self, sinks: Sequence[LabelSink] = ()) -> None:
        self._sinks = tuple(sinks)
        # What each sink was last handed: its labels, or None once withdrawn; absent: unknown.
        self._last: dict[str, dict[str, str] | None] = {}

    async def publish(self, config: Config, inventory: Inventory, plan: Plan) -> None:
        asked = [sink for sink in self._sinks if sink.wanted(config)]
        if not asked and not any(self._last.values()):
            return  # nothing to publish nor to take back: the labels are not even computed
        labels: dict[str, str] = {}
        if asked:
            # Imported only where labels are published, as the sinks' adapters are.
            from sharing_plugin.views.labels import labels_for

            labels = labels_for(config, inventory, plan)
        for sink in self._sinks:
            wanted = labels if sink in asked else None
            if sink.name in self._last and self._last[sink.name] == wanted:
                continue
            try:
                if wanted is None:
                    if sink.name in self._last:  # never published: nothing to take back
                        await sink.withdraw()
                else:
                    await sink.write(wanted)
            except (SharingPluginError, OSError) as exc:
                log.warning("%s: %s; trying again at the next change", sink.name, exc)
                self._last.pop(sink.name, None)
                continue
            self._last[sink.name] = wanted

    async def close(self, *, clear: bool) -> None:
        """SIGTERM: each sink takes back what goes with the plugin."""
        for sink in self._sinks:
            try:
                await sink.close(clear=clear)
            except (SharingPluginError, OSError) as exc:
                log.warning("%s: %s", sink.name, exc)
