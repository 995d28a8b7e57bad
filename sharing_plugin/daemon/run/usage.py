"""Who uses the shared GPUs: per-pod usage read when asked, and over-share detection.

    usage = UsageMonitor(nvml=..., proc_root=..., metrics=..., status=..., pod_resources=...)
    usage.start(client=..., node_name=..., reporter=...)   # once the API client is known
    usage.follow(plan=..., inventory=..., over_share_s=...)  # after each applied config
    await usage.refresh()                                   # before /metrics and /status
    await usage.close()

A reading is one pass over NVML (every GPU's processes, memory and utilization, in a worker
thread), the cgroups of the pids it lists, and PodResources; `usage.report` turns it into a
`UsageSnapshot`. It is made when someone asks (a scrape, `/status`) and shared by every request
within a second, so parallel scrapes cost one pass and a node nobody scrapes reads nothing.

Over-share detection needs to look without being asked, but only while it matters: a check
runs while a pod holds or uses a shared device, every quarter of `usage.overShareSeconds` (1
to 15 s), and at the moment a pod over its share would pass the allowed time. It starts when a
pod is granted a replica of a shared resource (an Allocate), when a config with shared devices
is applied, or when a reading sees a pod on a shared device, and ends at the first check that
finds none; a check first asks PodResources, and reads NVML only when a shared replica is held
(or the last reading saw a pod using one). An idle node, or one whose GPUs are not shared, runs
no periodic work at all.

The pods on this node are watched through the API only once a GPU process's cgroup names a pod
(the proc root shows the host's processes and `--node-name` and credentials are given); until
then, and without the API, processes are attributed from PodResources.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sharing_plugin.config.usage import DEFAULT_OVER_SHARE_SECONDS
from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.kit.tasks import TaskOwner
from sharing_plugin.kubelet.podresources import PodResourcesClient
from sharing_plugin.nvml.api import NvmlApi
from sharing_plugin.observability.metrics import Metrics
from sharing_plugin.observability.status import StatusBoard, rfc3339
from sharing_plugin.plan.model import Plan

if TYPE_CHECKING:
    from lightkube import AsyncClient

    from sharing_plugin.daemon.run.late_caps import LateCaps
    from sharing_plugin.nvml.processes import ProcessReader
    from sharing_plugin.observability.nodestatus import NodeStatusReporter
    from sharing_plugin.observability.usage import UsageView
    from sharing_plugin.sources.pods import NodePods
    from sharing_plugin.sources.proc import CgroupReader
    from sharing_plugin.usage.model import CgroupRef, NvmlUsage, PodIdentity, UsageSnapshot
    from sharing_plugin.usage.overshare import Exceeded, OverShareTracker

log = logging.getLogger(__name__)

REASON = "GpuShareExceeded"
FRESH_S = 1.0  # readings younger than this are shared
_CHECK_S = (1.0, 15.0)  # bounds of the over-share check interval
_PODS_SYNC_S = 2.0  # how long a reading waits for the first LIST of the node's pods


@dataclass(frozen=True, slots=True)
class _Followed:
    plan: Plan
    inventory: Inventory
    mps_gpus: frozenset[str]
    shared: frozenset[str]  # resources with a device of more than one replica


class UsageMonitor:
    """See the module doc."""

    def __init__(
        self,
        *,
        nvml: NvmlApi,
        proc_root: Path,
        metrics: Metrics,
        status: StatusBoard,
        pod_resources: PodResourcesClient,
    ) -> None:
        self._nvml = nvml
        self._proc_root = proc_root
        # Made at the first reading, with the usage package they need: a `run` that is never
        # scraped and whose pods hold no shared replica never loads it.
        self._readers: tuple[ProcessReader, CgroupReader] | None = None
        self._tracker: OverShareTracker | None = None
        self._late_caps: LateCaps | None = None
        self._metrics = metrics
        self._status = status
        self._pod_resources = pod_resources
        self._tasks = TaskOwner("usage")
        # The config default until the first config says otherwise (`follow`).
        self._over_share_s: float = DEFAULT_OVER_SHARE_SECONDS
        self._followed: _Followed | None = None
        self._view: UsageView | None = None
        self._view_at: float | None = None
        self._reading: asyncio.Task[None] | None = None
        self._check: asyncio.Task[None] | None = None
        self._retime = asyncio.Event()
        self._client: AsyncClient | None = None
        self._node_name: str | None = None
        self._reporter: NodeStatusReporter | None = None
        self._pods: NodePods | None = None
        metrics.add_exposition(self._exposition)
        metrics.on_allocate(self._on_allocate)
        status.set_usage(self._document)

    # --- lifecycle ---------------------------------------------------------------------------

    def start(
        self,
        *,
        client: AsyncClient | None,
        node_name: str | None,
        reporter: NodeStatusReporter | None,
    ) -> None:
        """What the API side offers: pods to name processes by, events to report with."""
        self._client = client
        self._node_name = node_name
        self._reporter = reporter

    def follow(self, *, plan: Plan, inventory: Inventory, over_share_s: float) -> None:
        """The plan now applied: what the GPUs are shared as, and for how long over is allowed."""
        self._followed = _Followed(
            plan=plan,
            inventory=inventory,
            mps_gpus=frozenset(d.uuid for m in plan.mps for d in m.devices),
            shared=frozenset(r.name for r in plan.resources if any(d.shared for d in r.devices)),
        )
        if over_share_s != self._over_share_s:
            self._over_share_s = over_share_s
            if self._tracker is not None:
                self._tracker.after_s = over_share_s
            self._retime.set()  # a waiting check takes the new interval
        self._view_at = None  # shares may have changed: the next request reads again
        if self._followed.shared:
            self._wake()

    async def close(self) -> None:
        await self._tasks.close()
        if self._readers is not None:
            await asyncio.to_thread(self._readers[0].close)

    # --- readings ----------------------------------------------------------------------------

    async def refresh(self, max_age: float = FRESH_S) -> None:
        """Make sure a reading at most `max_age` seconds old is shown; one at a time."""
        if self._followed is None:
            return  # no config applied yet: nothing is advertised, nothing to attribute
        now = asyncio.get_running_loop().time()
        if self._view_at is not None and now - self._view_at <= max_age:
            return
        if self._reading is None or self._reading.done():
            self._reading = self._tasks.spawn(self._read(), name="read")
        await asyncio.shield(self._reading)

    @property
    def view(self) -> UsageView | None:
        """The latest reading (None before the first)."""
        return self._view

    async def _read(self) -> None:
        from sharing_plugin.nvml.processes import ProcessReader
        from sharing_plugin.observability.usage import UsageView
        from sharing_plugin.sources.proc import CgroupReader
        from sharing_plugin.usage.overshare import OverShareTracker, pods_on_shared_devices
        from sharing_plugin.usage.report import build_report

        followed = self._followed
        assert followed is not None
        if self._readers is None:
            self._readers = (ProcessReader(self._nvml), CgroupReader(self._proc_root))
        if self._tracker is None:
            self._tracker = OverShareTracker(after_s=self._over_share_s)
        tracker = self._tracker
        held = await self._pod_resources.held_replicas()
        reading, cgroups = await asyncio.to_thread(self._read_node, followed)
        pods = await self._pods_by_uid(cgroups)
        report = build_report(
            plan=followed.plan,
            inventory=followed.inventory,
            nvml=reading,
            held=held,
            cgroups=cgroups,
            pods=pods,
        )
        if followed.plan.memory_limits is not None:
            await self._mend_caps(report, cgroups)
        now = asyncio.get_running_loop().time()
        newly = tracker.observe(pods_on_shared_devices(report), now)
        self._view = UsageView(
            report=report,
            exceeded=tuple(tracker.exceeded()),
            at=rfc3339(dt.datetime.now(dt.UTC)),
        )
        self._view_at = now
        for exceeded in newly:
            self._report_exceeded(exceeded)
        if report.shared_in_use:
            self._wake()

    async def _mend_caps(
        self, report: UsageSnapshot, cgroups: Mapping[int, CgroupRef | None]
    ) -> None:
        """Caps the hook did not set, set now (see `late_caps`)."""
        from sharing_plugin.daemon.run.late_caps import LateCaps
        from sharing_plugin.usage.caps import cgroup_caps

        caps = cgroup_caps(report, cgroups)
        if not caps:
            return
        if self._late_caps is None:
            self._late_caps = LateCaps(self._nvml, self._metrics)
        await asyncio.to_thread(self._late_caps.mend, caps)

    def _read_node(self, followed: _Followed) -> tuple[NvmlUsage, dict[int, CgroupRef | None]]:
        """The blocking part: NVML, then the cgroups of the pids it listed."""
        assert self._readers is not None
        reader, cgroups = self._readers
        reading = reader.read(followed.inventory, mps=followed.mps_gpus)
        return reading, cgroups.cgroups(p.pid for p in reading.processes)

    async def _pods_by_uid(
        self, cgroups: Mapping[int, CgroupRef | None]
    ) -> Mapping[str, PodIdentity] | None:
        """The node's pods once a process in a pod's cgroup is seen (see the module doc)."""
        if self._pods is None:
            if self._client is None or self._node_name is None:
                return None
            if not any(ref is not None for ref in cgroups.values()):
                return None
            from sharing_plugin.sources.pods import NodePods

            self._pods = NodePods(self._client, self._node_name)
            self._tasks.spawn(self._pods.run(), name="node-pods", eternal=True)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_PODS_SYNC_S):
                    await self._pods.synced.wait()
        return self._pods.by_uid if self._pods.synced.is_set() else None

    def _document(self) -> dict[str, Any] | None:
        if self._view is None:
            return None
        from sharing_plugin.observability.usage import usage_document

        return usage_document(self._view)

    def _exposition(self) -> bytes:
        from sharing_plugin.observability.usage import UsageExposition

        return UsageExposition(lambda: self._view).text()

    # --- over-share --------------------------------------------------------------------------

    def _on_allocate(self, resource: str) -> None:
        if self._followed is not None and resource in self._followed.shared:
            self._wake()

    def _wake(self) -> None:
        if self._check is not None and not self._check.done():
            return
        with contextlib.suppress(RuntimeError):  # closing: nothing more to check
            self._check = self._tasks.spawn(self._checks(), name="over-share-check")

    async def _checks(self) -> None:
        """Look again while shared devices are in use; end at the first look that finds none.

        The first look waits one interval: after an Allocate, kubelet lists the pod in
        PodResources only once the container is being created."""
        loop = asyncio.get_running_loop()
        while True:
            interval = min(max(self._over_share_s / 4, _CHECK_S[0]), _CHECK_S[1])
            deadline = self._tracker.next_deadline() if self._tracker is not None else None
            delay = interval if deadline is None else min(interval, deadline - loop.time())
            self._retime.clear()
            try:
                async with asyncio.timeout(max(delay, 0.0)):
                    await self._retime.wait()
                continue  # a new config: wait again, by its interval
            except TimeoutError:
                pass
            due = deadline is not None and delay < interval
            if not due and not await self._pods_hold_shared():
                return
            await self.refresh(max_age=0.0 if due else interval)
            view = self._view
            if view is None or not view.report.shared_in_use:
                return

    async def _pods_hold_shared(self) -> bool:
        """Whether a reading may find something to check: PodResources shows a replica of a
        shared resource held (unknown counts as yes), or the last reading saw a pod on a shared
        device. Asked before NVML, so a config applied on an idle node costs one List."""
        if self._view is not None and self._view.report.shared_in_use:
            return True
        followed = self._followed
        if followed is None:
            return False
        held = await self._pod_resources.held_replicas()
        return held is None or any(r.resource in followed.shared for r in held)

    def _report_exceeded(self, exceeded: Exceeded) -> None:
        u = exceeded.usage
        where = (
            f"GPU {u.index} ({u.gpu})"
            if not u.mig
            else f"MIG device {u.index} ({u.mig}) of GPU {u.gpu}"
        )
        replicas = (
            f"{u.replicas} replica{'s' if u.replicas != 1 else ''} of {u.resource}"
            if u.replicas
            else "no replica"
        )
        message = (
            f"pod {u.namespace}/{u.pod} uses {_gib(u.memory)} of {where}, over its share of "
            f"{_gib(u.share)} ({replicas}) for more than {self._over_share_s:g} s"
        )
        log.warning("%s", message, extra={"reason": REASON})
        self._metrics.count_share_exceeded(u.gpu)
        reporter = self._reporter
        if reporter is None:
            return
        # Imported here, as the daemon imports node status only when it reports (start-up).
        from sharing_plugin.observability.nodestatus import PodRef

        uid = None
        if self._pods is not None:
            uid = next(
                (
                    p.uid
                    for p in self._pods.by_uid.values()
                    if (p.namespace, p.name) == (u.namespace, u.pod)
                ),
                None,
            )
        reporter.event(REASON, message, warning=True, pod=PodRef(u.namespace, u.pod, uid))
        reporter.event(REASON, message, warning=True)


def _gib(value: int) -> str:
    return f"{value / (1 << 30):.1f} GiB"
