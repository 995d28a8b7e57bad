"""Publishing the node's GFD-compatible labels: an NFD feature file and/or the Node itself.

After every applied config (a reload, a MIG layout change, GPUs found) the labels of the node
as it now advertises are computed from the plan, the same function `plan --format labels`
prints, and published where the options ask: `--labels-file` (NFD's `features.d`, written
atomically, removed at exit) and `--node-labels on` (merge-patched onto the Node, only the keys
this plugin owns; keys that no longer apply are removed). Unchanged labels write nothing.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from sharing_plugin.config.model import Config
from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.plan.model import Plan

if TYPE_CHECKING:
    from sharing_plugin.observability.labels_file import LabelsFile
    from sharing_plugin.observability.nodestatus import NodeStatusReporter

log = logging.getLogger(__name__)


class LabelPublisher:
    """Publishes the labels of each applied plan (see the module doc)."""

    def __init__(self, *, file: Path | None, reporter: NodeStatusReporter | None) -> None:
        self._file: LabelsFile | None = None
        if file is not None:
            # Imported only where labels are published, as the labels themselves are.
            from sharing_plugin.observability.labels_file import LabelsFile

            self._file = LabelsFile(file)
        self._reporter = reporter
        self._last: dict[str, str] | None = None

    @property
    def active(self) -> bool:
        return self._file is not None or self._reporter is not None

    async def publish(self, config: Config, inventory: Inventory, plan: Plan) -> None:
        if not self.active:
            return
        from sharing_plugin.observability.labels_file import LabelsFileError
        from sharing_plugin.views.labels import labels_for

        labels = labels_for(config, inventory, plan)
        if labels == self._last:
            return
        self._last = labels
        if self._file is not None:
            try:
                await asyncio.to_thread(self._file.write, labels)
            except LabelsFileError as exc:
                log.warning("%s; trying again at the next change", exc)
                self._last = None
        if self._reporter is not None:
            self._reporter.labels(labels)

    async def close(self) -> None:
        """Remove the feature file (SIGTERM): the node's labels go with the plugin."""
        if self._file is None:
            return
        from sharing_plugin.observability.labels_file import LabelsFileError

        try:
            await asyncio.to_thread(self._file.remove)
        except LabelsFileError as exc:
            log.warning("%s", exc)
