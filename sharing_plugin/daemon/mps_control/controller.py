"""`mps-control`: one MPS control daemon per MPS resource of the config, kept in step with it.

    async with MpsController(options, nvml=backend_from_spec(...), control=ControlBinary(...)):
        ...                                   # until SIGTERM

The config comes through the same node pipeline as `run`'s (file, mounted ConfigMap, the
ConfigMap through the API, the node label; validated and planned the same way), so both
containers of the pod agree on which resources are MPS and over which GPUs; the plan's
`MpsDaemon` values say what each daemon must be. A reload compares them with the running
ones by fingerprint (GPUs and limits): an unchanged daemon is left alone, a new one started,
and a changed or removed one replaced or stopped only once no pod holds a replica of its
resource (kubelet's PodResources, as for draining in `run`), because stopping a daemon kills
its clients. Until then it keeps serving with its old limits and its state file says it is
waiting, with why.

Stopping `mps-control` leaves the daemons running: the next `mps-control` adopts them, and the
plugin stops vouching for them once their state file is no longer confirmed.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sharing_plugin.daemon.mps_control.keeper import DaemonKeeper, KeeperTiming
from sharing_plugin.daemon.node.options import SourceOptions
from sharing_plugin.daemon.node.outcome import NodeView, Served
from sharing_plugin.daemon.node.recheck import HELD_RECHECK_S, HeldRecheck
from sharing_plugin.daemon.node.report import Reports
from sharing_plugin.daemon.node.service import NodeService
from sharing_plugin.dra.checkpoint import Checkpoint, checkpoint_path, held_by_resource
from sharing_plugin.kubelet.podresources import LastAnswer, PodResourcesClient
from sharing_plugin.mps import MpsControl
from sharing_plugin.nvml.api import NvmlApi
from sharing_plugin.plan.mps import MpsDaemon
from sharing_plugin.views.dra_api import DEFAULT_DRIVER

if TYPE_CHECKING:
    from lightkube import AsyncClient

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class MpsControlOptions:
    """What `sharing-plugin mps-control` was asked to do."""

    source: SourceOptions = field(default_factory=SourceOptions)
    control_bin: str = "nvidia-cuda-mps-control"
    # DRA mode: each client's limits come from its claim (CDI edits), not the daemon's defaults,
    # and the claims run-dra (this DRA driver) prepared hold a daemon as pods' replicas do.
    limits_from_claims: bool = False
    driver_name: str = DEFAULT_DRIVER
    timing: KeeperTiming = field(default_factory=KeeperTiming)
    recheck_s: float = HELD_RECHECK_S  # how often pods are asked about while a change waits


@dataclass(slots=True)
class _Kept:
    keeper: DaemonKeeper
    task: asyncio.Task[Any]


class MpsController(NodeService[None]):
    """The `mps-control` process: config in, one supervised control daemon per MPS resource."""

    def __init__(
        self,
        options: MpsControlOptions,
        *,
        nvml: NvmlApi,
        control: MpsControl,
        kube_client: AsyncClient | None = None,
    ) -> None:
        self.options = options
        self.control = control
        self._keepers: dict[str, _Kept] = {}
        self._wanted: dict[str, MpsDaemon] = {}
        self._lock = asyncio.Lock()
        self.pod_resources = PodResourcesClient(options.source.kubelet_dir)
        self._last_held = LastAnswer(self.pod_resources.held_devices)
        self.claims: Checkpoint | None = None
        if options.limits_from_claims:
            where = checkpoint_path(options.source.kubelet_dir, options.driver_name)
            self.claims = Checkpoint(where)
        # Metrics and /status are `run`'s, in the same pod: here the reports are the log.
        super().__init__(
            options.source,
            name="mps-control",
            nvml=nvml,
            kube_client=kube_client,
            reports=Reports(status=None, metrics=None),
        )
        self._recheck = HeldRecheck(
            self._tasks, name="mps-recheck", every_s=options.recheck_s, again=self._reconcile
        )

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        await self.pipeline.connect()
        await self.pipeline.start()

    async def close(self) -> None:
        """Stop supervising; the daemons keep running for the next `mps-control` to adopt."""
        await self.pipeline.close()
        await self._tasks.close()
        self._keepers.clear()
        await self.pod_resources.close()
        await self.pipeline.close_client()

    # --- the pipeline's consumer ---------------------------------------------------------------

    def check(self, node: NodeView) -> None:
        """Every plan can be served."""

    async def apply(self, node: NodeView, checked: None) -> Served:
        async with self._lock:
            self._wanted = {
                d.resource: d.for_claims() if self.options.limits_from_claims else d
                for d in node.applied.plan.mps
            }
        await self._reconcile()
        return Served(f"MPS daemons for {', '.join(self._wanted) or 'no resource'}")

    # --- daemons -----------------------------------------------------------------------------

    async def _reconcile(self) -> bool:
        """Bring the running daemons in line with `_wanted`, sparing daemons pods still use;
        whether a change waits for pods."""
        async with self._lock:
            held: dict[str, int] | None = None
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
                    held = await self._held()
                holders = held.get(name, 0)
                if holders:
                    what = "new GPUs or limits" if want is not None else "stopping the daemon"
                    unit = "device(s) their claims" if self.claims else "replica(s) they"
                    kept.keeper.set_waiting(
                        f"{what} waits until pods release the {holders} {unit} hold"
                    )
                    waiting = True
                    continue
                await self._drop(name, retire=want is None)
                if want is not None:
                    self._keep(want)
            if waiting:
                self._recheck.schedule()
            return waiting

    async def _held(self) -> dict[str, int]:
        """Devices pods hold, by resource: the kubelet's device-plugin devices, and in DRA mode
        the devices of the claims run-dra prepared (PodResources does not list those)."""
        await self._last_held.ask()
        held = {name: len(ids) for name, ids in self._last_held.held.items()}
        if self.claims is not None:
            claims = await asyncio.to_thread(self.claims.peek)
            if claims is None:
                # Unreadable now: assume every daemon is in use rather than end its clients.
                log.warning("cannot read %s: MPS daemons are kept as they are", self.claims.path)
                return {name: 1 for name in {*self._keepers, *self._wanted}}
            for name, count in held_by_resource(claims).items():
                held[name] = held.get(name, 0) + count
        return held

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
