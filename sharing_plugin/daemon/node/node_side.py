"""The node pipeline's side of the node itself: the API client, the label naming the config,
and what is published about the node (its status, its GFD labels and the NFD feature file).

The label is read once before the first config (bounded, so a slow API server does not hold up
the start) and then followed; a change asks the config source to read again. What was published
on the node is taken back at exit: the NFD feature file always, the Node's labels with
`clearLabelsOnExit`, after the reports still being written have had a bounded moment to finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sharing_plugin.config.model import Config
from sharing_plugin.daemon.node.kube import api_client
from sharing_plugin.daemon.node.labels import (
    FileSink,
    LabelPublisher,
    LabelSink,
    NodeFeatureSink,
    NodeLabelsSink,
)
from sharing_plugin.daemon.node.options import NodeReportOptions, SourceOptions
from sharing_plugin.daemon.node.report import NodeReport, Reports
from sharing_plugin.errors import SharingPluginError
from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.kit.tasks import TaskOwner
from sharing_plugin.plan.model import Plan

if TYPE_CHECKING:
    from lightkube import AsyncClient

    from sharing_plugin.observability.nodestatus import NodeStatusReporter

log = logging.getLogger(__name__)

_LABEL_FETCH_TIMEOUT_S = 5.0
_CLEAR_TIMEOUT_S = 1.0
_FLUSH_TIMEOUT_S = 1.0


@dataclass(frozen=True, slots=True)
class Connection:
    """The Kubernetes side `connect` made: the API client (None: no feature needs the API) and
    `run`'s node status reporter (None: off)."""

    client: AsyncClient | None
    reporter: NodeStatusReporter | None


class NodeSide:
    """The API client, the config label and the node's reports of one pipeline."""

    def __init__(
        self,
        options: SourceOptions,
        *,
        client: AsyncClient | None,
        tasks: TaskOwner,
        reports: Reports,
        node_report: NodeReportOptions | None,
        on_label: Callable[[], None],
    ) -> None:
        self._options = options
        self.client = client
        self._own_client: AsyncClient | None = None  # made here, so closed here
        self._tasks = tasks
        self._reports = reports
        self._node_report = node_report
        self._on_label_changed = on_label
        self._labels = LabelPublisher()
        self.label_value: str | None = None
        """The node label naming the config, as last seen (None: not set, or not known)."""

    async def connect(self) -> Connection:
        """The client (when a feature needs it), the label (read first, so the labelled config
        is the first one applied), and `run`'s node status reporter."""
        if self.client is None and self._options.needs_api:
            self.client = self._own_client = api_client(self._options)
        await self._watch_label()
        self._start_node_report()
        return Connection(self.client, self._reports.node.reporter)

    async def publish_labels(self, config: Config, inventory: Inventory, plan: Plan) -> None:
        await self._labels.publish(config, inventory, plan)

    async def close(self) -> None:
        """Take back what was published on the node itself."""
        clear = self._node_report is not None and self._node_report.clear_labels_on_exit
        await self._labels.close(clear=clear)
        reporter = self._reports.node.reporter
        if reporter is not None:
            # What was reported last (a rejected edit's state label, its event) is still being
            # written in the background: let it finish, within a bound, before the tasks stop.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_FLUSH_TIMEOUT_S):
                    await reporter.flush()
        if reporter is not None and clear:
            try:
                async with asyncio.timeout(_CLEAR_TIMEOUT_S):
                    await reporter.clear()
            except Exception as exc:
                log.warning("clearing node %s's labels: %s", reporter.node_name, exc)

    async def close_client(self) -> None:
        if self._own_client is not None:
            await self._own_client.close()
            self._own_client = None

    async def _watch_label(self) -> None:
        node, client = self._options.node_name, self.client
        if node is None or client is None:
            return
        # Imported with the API client: a `run` without one never loads the API's sources.
        from sharing_plugin.sources.nodelabel import NodeLabelWatcher

        watcher = NodeLabelWatcher(
            node,
            label=self._options.config_label,
            client=client,
            on_trouble=self._reports.api_trouble,
        )
        try:
            async with asyncio.timeout(_LABEL_FETCH_TIMEOUT_S):
                self.label_value = await watcher.fetch()
        except (SharingPluginError, OSError, TimeoutError) as exc:
            log.warning("reading node %s's labels: %s", node, exc)
        self._tasks.spawn(watcher.run(self._on_label), name="node-label", eternal=True)

    def _on_label(self, value: str | None) -> None:
        if value == self.label_value:
            return
        log.info("node label %s is now %r", self._options.config_label, value)
        self.label_value = value
        self._on_label_changed()

    def _start_node_report(self) -> None:
        wanted = self._node_report
        if wanted is None:
            return
        node, client = self._options.node_name, self.client
        reporter = None
        if node is not None and client is not None and (wanted.node_status or wanted.node_labels):
            from sharing_plugin.observability.nodestatus import NodeStatusReporter

            reporter = NodeStatusReporter(client, node)
            self._tasks.spawn(reporter.run(), name="node-status", eternal=True)
        elif wanted.node_labels:
            log.warning("--node-labels needs --node-name and Kubernetes credentials: off")
        self._reports.node = NodeReport(reporter if wanted.node_status else None)
        sinks: list[LabelSink] = []
        if wanted.labels_file is not None:
            sinks.append(FileSink(wanted.labels_file))
        if reporter is not None and wanted.node_labels:
            sinks.append(NodeLabelsSink(reporter))
        sinks.append(self._node_feature_sink(wanted))
        self._labels = LabelPublisher(sinks)

    def _node_feature_sink(self, wanted: NodeReportOptions) -> NodeFeatureSink:
        """The NodeFeature object's sink; it writes only while the config asks for it."""
        node, client, namespace = self._options.node_name, self.client, wanted.pod_namespace
        if node is None or client is None or namespace is None:
            return NodeFeatureSink(
                None,
                missing="flags.useNodeFeatureAPI needs --node-name, Kubernetes credentials and "
                "POD_NAMESPACE (the namespace to write the NodeFeature object in); not written",
            )
        from sharing_plugin.observability.nodefeature import NodeFeatureWriter, PodOwner

        owner = None
        if wanted.pod_name and wanted.pod_uid:
            owner = PodOwner(wanted.pod_name, wanted.pod_uid)
        writer = NodeFeatureWriter(client, node, namespace=namespace, owner=owner)
        self._tasks.spawn(writer.run(), name="node-feature", eternal=True)
        return NodeFeatureSink(writer)
