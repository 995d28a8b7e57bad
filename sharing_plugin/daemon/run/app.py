"""`run`: the node pipeline's plans served to kubelet as device plugin resources.

    async with NodeDevicePlugin(options, nvml=backend_from_spec(options.source.gpus)) as daemon:
        await daemon.wait_stopped()      # until request_stop() (SIGTERM/SIGINT) is called

Start order (each gate before the next): the metrics server, the API side of the pipeline,
then the pipeline's first update -- the config read, the GPUs discovered, the declared MIG layout
applied, the plan made -- served here by starting and registering every resource server; then
the watches that change what is served: kubelet restarts here, the config, the node and GPU
health in the pipeline. A config that does not validate or does not fit the node changes
nothing: the last good one keeps serving. At start, with no good config yet, nothing is
advertised until one arrives; the process stays up so that fixing the ConfigMap is enough.

What this consumer adds to a plan: GPU health and MPS daemon state gate its devices' health
(`effective`), PodResources keeps what pods hold advertised (the supervisor's draining), and
Allocate answers get the host's control device nodes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sharing_plugin.daemon.node.consumer import PipelineOptions
from sharing_plugin.daemon.node.outcome import Applied, NodeView, Served
from sharing_plugin.daemon.node.service import ObservedService
from sharing_plugin.daemon.run.memory_spec import MemoryLimitSpec
from sharing_plugin.daemon.run.mps_gate import MpsGate
from sharing_plugin.daemon.run.options import RunOptions
from sharing_plugin.daemon.run.supervisor import Supervisor
from sharing_plugin.daemon.run.usage import UsageMonitor
from sharing_plugin.gpus.holders import Holder
from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.kubelet.podresources import PodResourcesClient
from sharing_plugin.kubelet.server import AllocateContext
from sharing_plugin.kubelet.watch import KubeletWatcher
from sharing_plugin.nvml.api import NvmlApi
from sharing_plugin.plan import CONTROL_DEVICE_NODES
from sharing_plugin.plan.model import Plan

if TYPE_CHECKING:
    from lightkube import AsyncClient


class NodeDevicePlugin(ObservedService[None]):
    """One running device plugin; an async context manager that starts in order and stops
    cleanly."""

    def __init__(
        self,
        options: RunOptions,
        *,
        nvml: NvmlApi,
        kube_client: AsyncClient | None = None,
    ) -> None:
        """`nvml` is the NVML the entry chose for `options.source.gpus` (the real module or the
        simulator); `kube_client` replaces the credentials found in the environment."""
        self.options = options
        super().__init__(
            options,
            name="device-plugin",
            nvml=nvml,
            kube_client=kube_client,
            pipeline_options=PipelineOptions(
                health_env=options.health_env,
                mig_held_by=self._held_by,
                mig_retry_s=options.drain_recheck_s,
                node_report=options.report,
            ),
        )
        self.pod_resources = PodResourcesClient(options.source.kubelet_dir, metrics=self.metrics)
        self.usage = UsageMonitor(
            nvml=nvml,
            proc_root=options.proc_root,
            metrics=self.metrics,
            status=self.status,
            pod_resources=self.pod_resources,
        )
        self.supervisor = Supervisor(
            kubelet_dir=options.source.kubelet_dir,
            metrics=self.metrics,
            status=self.status,
            pod_resources=self.pod_resources,
            drain_recheck_s=options.drain_recheck_s,
            grant_window_s=options.grant_window_s,
        )
        self.mps = MpsGate(
            tasks=self._tasks, status=self.status, metrics=self.metrics, on_change=self._on_mps
        )
        self.memory_spec = MemoryLimitSpec(
            options.cdi_dir, hook_path_default=options.source.hook_path_default
        )

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        await self.start_metrics_server(refresh=self.usage.refresh)
        api = await self.pipeline.connect()
        self.usage.start(
            client=api.client, node_name=self.options.source.node_name, reporter=api.reporter
        )
        await self.pipeline.start()
        watcher = KubeletWatcher(
            self.options.source.kubelet_dir,
            self.supervisor.kubelet_restarted,
            self.supervisor.socket_removed,
            own_sockets=self.supervisor.own_sockets,
        )
        self._tasks.spawn(watcher.run(), name="kubelet-watch", eternal=True)

    async def close(self) -> None:
        await self.pipeline.close()
        await self._tasks.close()
        await self.usage.close()
        await self.supervisor.close()
        await self.pod_resources.close()
        await self.close_metrics_server()
        await self.pipeline.close_client()

    def held_up(self) -> Collection[asyncio.Task[Any]]:
        return self.supervisor.lingering

    # --- the pipeline's consumer ---------------------------------------------------------------

    def check(self, node: NodeView) -> None:
        """Every plan can be served once the CDI spec its caps name is written."""
        self.memory_spec.follow(node.applied)

    async def apply(self, node: NodeView, checked: None) -> Served:
        applied = node.applied
        self.mps.follow(applied.plan.mps)
        self.usage.follow(
            plan=applied.plan,
            inventory=applied.inventory,
            over_share_s=applied.config.usage.over_share_seconds,
        )
        change = await self.supervisor.apply(self.effective(node), self._context(applied))
        return Served(change.describe(), changed=not change.empty)

    async def _held_by(self, inventory: Inventory) -> dict[str, Holder] | None:
        return await self.pod_resources.held_by()

    async def serve_again(self, node: NodeView) -> None:
        await self.supervisor.apply(self.effective(node), self._context(node.applied))

    async def _on_mps(self) -> None:
        """An MPS daemon started or stopped serving: its resource's devices follow."""
        await self.pipeline.serve_again()

    def effective(self, node: NodeView) -> Plan:
        """What kubelet is told: the plan with Unhealthy GPUs and MPS daemons that do not serve
        marked, before the supervisor adds what pods still hold."""
        return self.mps.gate(node.plan)

    def _context(self, applied: Applied) -> AllocateContext:
        flags = applied.config.flags
        return AllocateContext(
            flags=flags,
            inventory=applied.inventory,
            control_nodes=_present(CONTROL_DEVICE_NODES, flags.nvidia_dev_root),
        )


def _present(nodes: tuple[str, ...], dev_root: str) -> tuple[str, ...]:
    """The control device nodes that exist under `dev_root` (the reference stats each one)."""
    root = Path(dev_root)
    return tuple(n for n in nodes if (root / n.lstrip("/")).exists())
