"""`run-dra`: the node pipeline's plans served as a DRA kubelet plugin (docs/contract.md, "DRA
mode").

    async with DraDriver(options, nvml=backend_from_spec(options.source.gpus)) as daemon:
        await daemon.wait_stopped()      # until request_stop() (SIGTERM/SIGINT) is called

Start order: the API (credentials, then which resource.k8s.io version the server serves), the
pipeline's first update (config, GPUs, the same `plan_node` as `run` and `plan`), a refusal where
a device plugin serves the same names on this node, the DRA socket and the registration socket,
then the task that publishes the pool once the kubelet confirmed the registration.

The pool is a value recomputed from three inputs: the plan (config and GPUs), GPU health, and the
devices prepared claims hold. Any change marks it dirty and one publishing task writes the
newest pool (intermediate states are skipped; a failed write is retried with backoff), so a
burst of reloads or health events never races two writers. Held devices the plan dropped stay
published until their claim is unprepared (the draining rule). An unhealthy GPU's devices stay
published with a `NoSchedule` taint naming the fault, where the server keeps device taints
(asked once at start with a dry run); elsewhere they leave the pool at once. The kubelet hears
every device's health on the DRA socket. After every registration the kubelet confirms, the
pool is written again even if unchanged: the kubelet deletes a driver's slices when the driver
goes away.

Declared MIG layouts (`partitioning.mig` with `profiles`) are applied as `run` applies them,
with "held" meaning the GPU and MIG devices prepared claims hold. A dynamic entry's GPUs are
published as partitionable devices (`views/dra_mig.py`) and their instances made and destroyed
per claim (`daemon/run_dra/mig.py`); that needs resource.k8s.io/v1.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sharing_plugin.daemon.node.consumer import PipelineOptions
from sharing_plugin.daemon.node.health_monitor import HealthEnv
from sharing_plugin.daemon.node.options import SourceOptions
from sharing_plugin.daemon.node.outcome import Applied, NodeView, Outcome, Served
from sharing_plugin.daemon.node.service import ObservedService
from sharing_plugin.daemon.run_dra.conflicts import (
    check_no_device_plugin,
    check_no_device_plugin_serving,
)
from sharing_plugin.daemon.run_dra.features import ServerFeatures
from sharing_plugin.daemon.run_dra.mig import NodePartitioner, claim_holders
from sharing_plugin.daemon.run_dra.pool import PoolWriter
from sharing_plugin.dra.checkpoint import Checkpoint, checkpoint_path
from sharing_plugin.dra.claims import ApiClaimReader
from sharing_plugin.dra.health import DeviceHealthServicer
from sharing_plugin.dra.prepare import ClaimPreparer, PoolState
from sharing_plugin.dra.resources import discover_version
from sharing_plugin.dra.server import DraPluginServer
from sharing_plugin.dra.slices import SlicePublisher
from sharing_plugin.errors import KubeApiError, StartupError
from sharing_plugin.gpus.holders import Holder
from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.kit.cdi import CdiSpecDir
from sharing_plugin.nvml.api import NvmlApi
from sharing_plugin.observability.nodestatus import NodeStatusReporter
from sharing_plugin.views.dra import config_resource_names
from sharing_plugin.views.dra_api import DEFAULT_DRIVER
from sharing_plugin.views.dra_shares import HeldShare, held_share

if TYPE_CHECKING:
    from lightkube import AsyncClient

log = logging.getLogger(__name__)

_CLEAR_TIMEOUT_S = 2.0
_FLUSH_TIMEOUT_S = 1.0
# How often this instance looks whether another instance of the driver stopped serving, and
# when, after it noticed, it tells the kubelet the devices' health again: the kubelet forgets
# the driver's health as that instance's stream ends, which it sees within about a second (its
# plugin manager looks every second); the second send covers a kubelet that was late.
_OTHERS_POLL_S = 0.5
_HEALTH_AGAIN_S = (2.0, 3.0)


@dataclass(frozen=True, slots=True)
class DraOptions:
    """What `sharing-plugin run-dra` takes: the config sources, plus the driver's own."""

    source: SourceOptions = field(default_factory=SourceOptions)
    metrics_address: tuple[str, int] | None = None
    health_env: HealthEnv = field(default_factory=HealthEnv)
    driver_name: str = DEFAULT_DRIVER
    cdi_dir: Path = Path("/var/run/cdi")
    clear_slices_on_exit: bool = False
    publish_backoff_s: tuple[float, float] = (0.2, 10.0)


class DraDriver(ObservedService[PoolState]):
    """One running DRA kubelet plugin; an async context manager that starts in order."""

    def __init__(
        self, options: DraOptions, *, nvml: NvmlApi, kube_client: AsyncClient | None = None
    ) -> None:
        self.options = options
        self.health: DeviceHealthServicer | None = None
        self.preparer: ClaimPreparer | None = None
        self.keeper: PoolWriter | None = None
        self.server: DraPluginServer | None = None
        self.node_events: NodeStatusReporter | None = None
        super().__init__(
            options,
            name="dra",
            nvml=nvml,
            kube_client=kube_client,
            pipeline_options=PipelineOptions(
                health_env=options.health_env,
                mig_held_by=self._held_by,
                dynamic_mig=lambda: self.server_features.dynamic_refused(),
            ),
        )
        self.server_features = ServerFeatures(self.status)

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        source, driver = self.options.source, self.options.driver_name
        node = source.node_name
        if node is None:
            raise StartupError("run-dra needs --node-name (NODE_NAME): the pool is the node's")
        await self.start_metrics_server()
        client = (await self.pipeline.connect()).client
        if client is None:
            raise StartupError("run-dra needs the Kubernetes API to publish ResourceSlices")
        try:
            version = await discover_version(client)
        except KubeApiError as exc:
            raise StartupError(str(exc)) from exc
        log.info("DRA driver %s on node %s speaks %s", driver, node, version)
        await self.server_features.discover(client, version, driver=driver, node_name=node)
        self.preparer = ClaimPreparer(
            driver=driver,
            pool=node,
            claims=ApiClaimReader(client, version),
            specs=CdiSpecDir(self.options.cdi_dir),
            checkpoint=Checkpoint(checkpoint_path(source.kubelet_dir, driver)),
            state=lambda: self.keeper.state if self.keeper else None,
            on_change=self._claims_changed,
            partitioner=NodePartitioner(
                self.nvml,
                node=lambda: (
                    self.keeper.node.inventory if self.keeper and self.keeper.node else None
                ),
                changed=self.pipeline.mig_devices_changed,
                metrics=self.metrics,
            ),
        )
        self.health = DeviceHealthServicer(pool=node)
        # Events on the Node only (no label, no annotation): a replicas edit that waits for
        # claims (docs/contract.md, "run-dra"), with `run`'s aggregation and rate limits.
        self.node_events = NodeStatusReporter(client, node)
        self._tasks.spawn(self.node_events.run(), name="node-events", eternal=True)
        self.keeper = PoolWriter(
            SlicePublisher(client, driver=driver, node_name=node, api_version=version),
            features=self.server_features,
            held=self.preparer.held,
            status=self.status,
            registered=lambda: self.server is not None and self.server.registered,
            backoff_s=self.options.publish_backoff_s,
            health=self.health,
            hook_path_default=source.hook_path_default,
            held_shares=self._held_shares,
            node_events=self.node_events,
        )
        # A device plugin serving here now stops run-dra before its first config touches MIG;
        # the names the Node lists allocatable are known only from that config.
        check_no_device_plugin_serving(node=node, kubelet_dir=source.kubelet_dir)
        first = await self.pipeline.start()
        await self._refuse_beside_a_device_plugin(client, first)
        self.server = DraPluginServer(
            kubelet_dir=source.kubelet_dir,
            driver=driver,
            preparer=self.preparer,
            on_registered=self.keeper.registered,
            health=self.health,
        )
        await self.server.start()
        self._tasks.spawn(self.keeper.run(), name="publish", eternal=True)
        self._tasks.spawn(
            self.server.others_leaving(self._others_left, poll_s=_OTHERS_POLL_S),
            name="others-leaving",
            eternal=True,
        )

    async def close(self) -> None:
        await self.pipeline.close()
        if self.node_events is not None:
            # An event reported just before the stop is still being written: let it finish,
            # within a bound, before the tasks stop.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_FLUSH_TIMEOUT_S):
                    await self.node_events.flush()
        await self._tasks.close()
        others: list[Path] = []
        if self.server is not None:
            await self.server.stop()
            others = self.server.others_serving()
        if others:
            # A rolling update's new instance serves the same pool: its slices stay.
            log.info(
                "leaving the ResourceSlices to the other instance serving (%s)",
                ", ".join(p.name for p in others),
            )
        elif self.options.clear_slices_on_exit and self.keeper is not None:
            try:
                async with asyncio.timeout(_CLEAR_TIMEOUT_S):
                    await self.keeper.publisher.clear()
            except (KubeApiError, TimeoutError) as exc:
                log.warning("removing the ResourceSlices at exit: %s", exc)
        await self.close_metrics_server()
        await self.pipeline.close_client()

    def _others_left(self, sockets: list[Path]) -> None:
        """Other instances of the driver stopped serving (a rolling update's old pod): the
        kubelet forgets every device's health when their health streams end (1.36 clears the
        driver's, not the instance's), so this instance tells it again once it has."""
        log.info(
            "another instance of DRA driver %s stopped serving (%s): telling the kubelet the "
            "devices' health again",
            self.options.driver_name,
            ", ".join(p.name for p in sockets),
        )
        self._tasks.spawn(self._health_again(), name="health-again")

    async def _health_again(self) -> None:
        for delay in _HEALTH_AGAIN_S:
            await asyncio.sleep(delay)
            if self.health is not None:
                self.health.resend()

    # --- the pipeline's consumer ---------------------------------------------------------------

    def check(self, node: NodeView) -> PoolState:
        """The plan's devices as DRA devices; PlanError for what the API cannot carry."""
        assert self.keeper is not None
        return self.keeper.state_for(node)

    async def apply(self, node: NodeView, checked: PoolState) -> Served:
        assert self.keeper is not None
        self.keeper.serve(node, checked)
        return Served(f"{len(checked.devices)} DRA device(s)")

    async def serve_again(self, node: NodeView) -> None:
        """GPU health changed, or an instance was made or destroyed for a claim."""
        if self.keeper is not None:
            self.keeper.node_changed(node)

    async def _refuse_beside_a_device_plugin(self, client: AsyncClient, first: Outcome) -> None:
        """StartupError where a device plugin serves this node's resource names (those of the
        first config, when it was applied)."""
        names: set[str] = set()
        if isinstance(first, Applied):
            names = {r.name for r in first.plan.resources} | config_resource_names(first.config)
        await check_no_device_plugin(
            client=client,
            node=self.options.source.node_name or "",
            kubelet_dir=self.options.source.kubelet_dir,
            names=names,
        )

    # --- dynamic MIG and declared layouts ------------------------------------------------------

    def _claims_changed(self) -> None:
        """Claims were prepared or unprepared: the pool keeps what they hold, and a declared
        layout that waited for a claim to let go of an instance is tried again now."""
        if self.keeper is not None:
            self.keeper.changed()
        self.pipeline.retry_mig_layout()

    def _held_shares(self) -> list[HeldShare]:
        """One entry per share prepared claims hold: what was published for its device, what
        the share consumed of it and what its request asked."""
        if self.preparer is None:
            return []
        return [
            held_share(entry, consumed_mib=device.consumed_mib, asked_mib=device.asked_mib)
            for claim in self.preparer.prepared.values()
            for device in claim.devices
            for entry in claim.published
            if entry.name == device.device
        ]

    async def _held_by(self, inventory: Inventory) -> dict[str, Holder]:
        """What prepared claims hold, for the declared layouts: never destroyed under them."""
        if self.preparer is None:
            return {}
        return claim_holders(self.preparer.prepared, inventory)
