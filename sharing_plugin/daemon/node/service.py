"""What every serving command is: a service fed by the node pipeline, stopped by a signal.

`NodeService` builds the command's `NodePipeline` with itself as the consumer, owns the tasks,
and turns SIGTERM/SIGINT into a graceful stop and SIGHUP into a re-read of the config.
`ObservedService` adds what `run` and `run-dra` show an admin: `/status`, the metrics and,
unless `--metrics-address off`, the HTTP server for both (`mps-control` has none: `run`, in the
same pod, serves them).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Generic, Protocol

from sharing_plugin.daemon.node.consumer import PLAIN_PIPELINE, Checked, PipelineOptions
from sharing_plugin.daemon.node.options import SourceOptions
from sharing_plugin.daemon.node.outcome import NodeView, Served
from sharing_plugin.daemon.node.pipeline import NodePipeline
from sharing_plugin.daemon.node.report import Reports
from sharing_plugin.kit.lifecycle import Service
from sharing_plugin.kit.tasks import TaskOwner
from sharing_plugin.nvml.api import NvmlApi
from sharing_plugin.observability.http_server import MetricsServer
from sharing_plugin.observability.metrics import Metrics
from sharing_plugin.observability.status import StatusBoard

if TYPE_CHECKING:
    from lightkube import AsyncClient


class NodeService(Service, Generic[Checked]):
    """A serving command fed by a `NodePipeline` (it is the pipeline's `PlanConsumer`; what its
    `check` returns, its `apply` is handed)."""

    def __init__(
        self,
        options: SourceOptions,
        *,
        name: str,
        nvml: NvmlApi,
        kube_client: AsyncClient | None,
        reports: Reports,
        pipeline_options: PipelineOptions = PLAIN_PIPELINE,
    ) -> None:
        self._stop = asyncio.Event()
        self._tasks = TaskOwner(name)
        self.nvml = nvml
        self.pipeline: NodePipeline[Checked] = NodePipeline(
            options,
            nvml=nvml,
            consumer=self,
            tasks=self._tasks,
            reports=reports,
            kube_client=kube_client,
            pipeline_options=pipeline_options,
        )

    def request_stop(self) -> None:
        """Begin a graceful stop (what SIGTERM and SIGINT do)."""
        self._stop.set()

    def request_reload(self) -> None:
        """Re-read the config now (what SIGHUP does)."""
        self.pipeline.request_reload()

    async def wait_stopped(self) -> None:
        await self._stop.wait()

    # --- the pipeline's consumer ---------------------------------------------------------------

    def check(self, node: NodeView) -> Checked:
        raise NotImplementedError

    async def apply(self, node: NodeView, checked: Checked) -> Served:
        raise NotImplementedError

    async def serve_again(self, node: NodeView) -> None:
        """A change of the node under the config is not this command's to act on, unless it
        says otherwise."""


class ObservedOptions(Protocol):
    """What a command with `/status` and metrics was asked: its sources, where to serve them."""

    @property
    def source(self) -> SourceOptions: ...
    @property
    def metrics_address(self) -> tuple[str, int] | None: ...


class ObservedService(NodeService[Checked]):
    """A `NodeService` with `/status` and metrics, served at `options.metrics_address` (None:
    off)."""

    def __init__(
        self,
        options: ObservedOptions,
        *,
        name: str,
        nvml: NvmlApi,
        kube_client: AsyncClient | None,
        pipeline_options: PipelineOptions = PLAIN_PIPELINE,
    ) -> None:
        self.metrics = Metrics()
        self.status = StatusBoard()
        self._metrics_address = options.metrics_address
        self._metrics_server: MetricsServer | None = None
        super().__init__(
            options.source,
            name=name,
            nvml=nvml,
            kube_client=kube_client,
            reports=Reports(status=self.status, metrics=self.metrics),
            pipeline_options=pipeline_options,
        )

    async def start_metrics_server(
        self, *, refresh: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        """The HTTP endpoints first, so probes and scrapes answer while the rest starts;
        `refresh` is awaited before `/metrics` and `/status` are rendered (GPU usage)."""
        if self._metrics_address is not None:
            host, port = self._metrics_address
            self._metrics_server = MetricsServer(
                host, port, self.metrics, self.status, refresh=refresh
            )
            await self._metrics_server.start()

    async def close_metrics_server(self) -> None:
        if self._metrics_server is not None:
            await self._metrics_server.close()
            self._metrics_server = None
