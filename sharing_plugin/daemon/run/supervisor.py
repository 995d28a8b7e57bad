"""The supervisor: one resource server per advertised resource, kept in step with the plan.

`apply(plan)` asks PodResources which devices pods hold, keeps held devices that the new plan
drops as draining (Unhealthy), diffs against what kubelet currently sees, and carries the diff
out: push changed device lists on the live ListAndWatch streams, stop removed resources, start
and register new ones. Unchanged resources are not touched at all. While anything drains,
PodResources is asked again every `drain_recheck_s` seconds so that a released device disappears;
with nothing draining there is no periodic work. While PodResources cannot answer (kubelet
restarting), what pods held at its last answer still counts. The first apply also removes the
sockets a killed earlier run left behind, and counts what pods hold from before the restart.

Allocate keeps answering while PodResources is asked, and kubelet records a grant only after
Allocate returns, so the answer may miss devices granted a moment ago: the servers note every
grant in a ledger, and from the answer's arrival until every live server holds its new snapshot
nothing awaits, so each grant is either in the ledger or served from the new snapshot. A device
kubelet asks for just after a reload withdrew it is honoured (see the servicer) and the ledger
asks for an apply at once, which advertises it again as draining.

Every operation runs under one lock: a reload, a health change and a kubelet restart never
interleave halfway.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path

from sharing_plugin.daemon.node.recheck import HELD_RECHECK_S, HeldRecheck
from sharing_plugin.errors import KubeletError
from sharing_plugin.kit.tasks import TaskOwner, raise_if_cancelled
from sharing_plugin.kubelet.grants import RECORD_WINDOW_S, GrantLedger
from sharing_plugin.kubelet.podresources import LastAnswer, PodResourcesClient
from sharing_plugin.kubelet.registration import kubelet_socket_id
from sharing_plugin.kubelet.server import (
    AllocateContext,
    ResourceServer,
    remove_stale_sockets,
)
from sharing_plugin.observability.metrics import Metrics
from sharing_plugin.observability.status import StatusBoard
from sharing_plugin.plan.diff import PlanDiff, diff, draining_ids, with_draining
from sharing_plugin.plan.model import Plan

log = logging.getLogger(__name__)

_REGISTER_BACKOFF_S = (0.2, 10.0)
# Kubelet dropped a registration (another instance's superseded stream ended): registered again
# at once, unless it dropped this resource's last one less than this long ago (then backed off).
_LOST_AGAIN_S = 1.0


class Supervisor:
    """Owns the resource servers and turns successive plans into kubelet-visible state."""

    def __init__(
        self,
        *,
        kubelet_dir: Path,
        metrics: Metrics,
        status: StatusBoard,
        pod_resources: PodResourcesClient | None,
        drain_recheck_s: float = HELD_RECHECK_S,
        grant_window_s: float = RECORD_WINDOW_S,
    ) -> None:
        self._kubelet_dir = kubelet_dir
        self._metrics = metrics
        self._status = status
        self._pod_resources = pod_resources
        self._servers: dict[str, ResourceServer] = {}
        self._advertised: Plan | None = None
        self._requested: tuple[Plan, AllocateContext] | None = None
        self._lock = asyncio.Lock()
        self._tasks = TaskOwner("supervisor")
        self._draining = HeldRecheck(
            self._tasks, name="drain-recheck", every_s=drain_recheck_s, again=self._recheck
        )
        self._retries: dict[str, asyncio.Task[None]] = {}
        self._grants = GrantLedger(record_window_s=grant_window_s, on_late=self._late_grant)
        # grpc shutdowns of stopped servers that a client which does not read holds up.
        self.lingering: set[asyncio.Task[None]] = set()
        self._last_held = LastAnswer(self.held_devices)
        self._reapply: asyncio.Task[None] | None = None
        self._reapply_due = False
        self._started = False
        self._lost_at: dict[str, float] = {}

    @property
    def advertised(self) -> Plan | None:
        """What kubelet is being told now, draining devices included."""
        return self._advertised

    def own_sockets(self) -> list[Path]:
        return [s.socket_path for s in self._servers.values() if s.socket_path is not None]

    async def held_devices(self) -> dict[str, frozenset[str]] | None:
        """What pods hold per resource, from PodResources; None when kubelet cannot tell."""
        if self._pod_resources is None:
            return None
        return await self._pod_resources.held_devices()

    async def apply(self, plan: Plan, context: AllocateContext) -> PlanDiff:
        """Make kubelet see `plan` (plus draining devices); returns what changed."""
        async with self._lock:
            return await self._apply(plan, context)

    async def _apply(self, plan: Plan, context: AllocateContext) -> PlanDiff:
        self._requested = (plan, context)
        if not self._started:
            self._started = True
            remove_stale_sockets(self._kubelet_dir)
        asked_at = self._grants.now()
        held = await self._last_held.ask()
        # From here until every live server has its new snapshot, nothing awaits: an Allocate
        # is either in the ledger read below or answered from the new snapshot.
        self._grants.settle(held, asked_at=asked_at)
        effective = with_draining(
            plan,
            self._advertised,
            self._last_held.held,
            granted=self._grants.outstanding(),
            node=context.inventory,
        )
        change = diff(self._advertised, effective)
        for resource in change.push:
            self._servers[resource.name].update(resource, context)
        # Allocate settings (flags) may change without any device change.
        for name in change.unchanged:
            self._servers[name].update(self._servers[name].resource, context)
        started = [
            ResourceServer(
                kubelet_dir=self._kubelet_dir,
                resource=resource,
                context=context,
                metrics=self._metrics,
                grants=self._grants,
                lingering=self.lingering,
                on_lost=self._registration_lost,
            )
            for resource in change.start
        ]
        self._servers.update((server.name, server) for server in started)
        # Recorded before registering: kubelet may hold a new resource's list before Register
        # returns, and whoever compares the two must already see the new plan.
        self._advertised = effective
        draining = draining_ids(effective, plan)
        self._report(effective, draining)
        for name in change.stop:
            await self._stop(name)
        for server in started:
            await self._register(server)
        if not change.empty:
            log.info("applied plan: %s", change.describe())
        if draining:
            self._draining.schedule()
        return change

    def _report(self, effective: Plan, draining: Mapping[str, tuple[str, ...]]) -> None:
        granted = self._grants.outstanding()
        replicas_in_use: dict[str, int] = {}
        for resource in effective.resources:
            held = self._last_held.held.get(resource.name, frozenset()) | {
                d.id for d in granted.get(resource.name, ())
            }
            in_use = [d for d in resource.devices if d.id in held]
            self._metrics.set_usage(
                resource.name,
                allocated=len(in_use),
                available=sum(1 for d in resource.devices if d.healthy and d.id not in held),
            )
            for device in resource.devices:
                if device.shared:
                    replicas_in_use.setdefault(device.gpu_uuid, 0)
            for device in in_use:
                if device.shared:
                    replicas_in_use[device.gpu_uuid] += 1
        self._metrics.set_replicas_in_use(replicas_in_use)
        for resource in effective.resources:
            leaving = draining.get(resource.name, ())
            self._status.set_resource(
                resource.name,
                devices=len(resource.devices),
                healthy=resource.healthy_count,
                draining=leaving,
            )
            self._metrics.set_devices(
                resource.name,
                total=len(resource.devices),
                healthy=resource.healthy_count,
                draining=len(leaving),
            )

    async def _stop(self, name: str) -> None:
        server = self._servers.pop(name)
        retry = self._retries.pop(name, None)
        if retry is not None:
            retry.cancel()
        await server.stop()
        self._status.remove_resource(name)
        self._metrics.forget_resource(name)
        log.info("stopped resource %s", name)

    async def _register(self, server: ResourceServer) -> bool:
        """Listen (when not yet) and register; a failure is logged and retried with backoff."""
        try:
            await server.start()
            await server.register()
        except (KubeletError, OSError) as exc:
            log.warning("registering %s with kubelet failed: %s (will retry)", server.name, exc)
            self._status.set_registered(server.name, False)
            self._retry_registration(server)
            return False
        self._status.set_registered(server.name, True)
        log.info("registered %s with kubelet on %s", server.name, server.socket_path)
        return True

    def _registration_lost(self, server: ResourceServer) -> None:
        """Kubelet ended the stream of `server`'s registration while it serves, or opened none
        after it: a rolling update's old instance left (docs/contract.md), or kubelet is
        stopping. Registered again on the same socket at once; a kubelet that is gone is
        retried with backoff."""
        self._status.set_registered(server.name, False)
        now = asyncio.get_running_loop().time()
        last = self._lost_at.get(server.name)
        self._lost_at[server.name] = now
        again = last is not None and now - last < _LOST_AGAIN_S
        try:
            self._retry_registration(server, first_delay=_REGISTER_BACKOFF_S[0] if again else 0.0)
        except RuntimeError:
            log.debug("registration of %s lost while shutting down", server.name)

    def _retry_registration(
        self, server: ResourceServer, *, first_delay: float | None = None
    ) -> None:
        if server.name in self._retries:
            return

        async def retry() -> None:
            delay, limit = _REGISTER_BACKOFF_S
            if first_delay is not None:
                delay = first_delay
            try:
                while True:
                    await asyncio.sleep(delay)
                    async with self._lock:
                        if self._servers.get(server.name) is not server or server.registered:
                            return
                        try:
                            await server.register()
                        except (KubeletError, OSError) as exc:
                            log.debug("registration of %s still failing: %s", server.name, exc)
                            raise_if_cancelled()
                        else:
                            self._status.set_registered(server.name, True)
                            log.info("registered %s with kubelet", server.name)
                            return
                    delay = min(max(delay, _REGISTER_BACKOFF_S[0]) * 2, limit)
            finally:
                self._retries.pop(server.name, None)

        self._retries[server.name] = self._tasks.spawn(retry(), name=f"register:{server.name}")

    async def kubelet_restarted(self) -> None:
        """Kubelet came (back): every resource listens on a fresh socket and registers again,
        but one already registered with the kubelet now listening. The end of its stream told
        that resource first (`_registration_lost`), and a second registration would make kubelet
        swap the endpoint it just dialled for another."""
        await self._end_retries(list(self._retries))
        async with self._lock:
            current = kubelet_socket_id(self._kubelet_dir)
            behind = [s for s in self._servers.values() if not s.registered_with(current)]
            log.info(
                "kubelet socket (re)created: re-registering %d resource(s)%s",
                len(behind),
                f" ({len(self._servers) - len(behind)} already registered with it)"
                if len(behind) < len(self._servers)
                else "",
            )
            for server in behind:
                await self._relisten(server)

    async def socket_removed(self, path: Path) -> None:
        """One of our sockets was deleted (kubelet cleans the directory when it starts)."""
        await self._end_retries(
            [name for name, server in self._servers.items() if server.socket_path == path]
        )
        async with self._lock:
            for server in list(self._servers.values()):
                if server.socket_path == path:
                    log.info("socket %s of %s was removed: listening again", path, server.name)
                    await self._relisten(server)

    async def _end_retries(self, names: list[str]) -> None:
        """End the registration retries of `names`, superseded by a fresh socket and
        registration: a retry may be waiting (holding the lock) on a Register whose dial-back
        goes to a socket a restarting kubelet just deleted, which kubelet answers only after
        its 10 s dial deadline."""
        retries = [task for name in names if (task := self._retries.get(name)) is not None]
        for task in retries:
            task.cancel()
        await asyncio.gather(*retries, return_exceptions=True)

    async def _relisten(self, server: ResourceServer) -> None:
        """A fresh socket and a new registration; a kubelet not back yet is retried."""
        self._status.set_registered(server.name, False)
        try:
            await server.restart()
        except (KubeletError, OSError) as exc:
            log.warning("re-registering %s failed: %s (will retry)", server.name, exc)
        self._status.set_registered(server.name, server.registered)
        if not server.registered:
            self._retry_registration(server)

    def _late_grant(self) -> None:
        """A server honoured a device it no longer advertises: advertise it again, draining."""
        self._reapply_due = True
        if self._reapply is not None and not self._reapply.done():
            return

        async def reapply() -> None:
            while self._reapply_due:
                self._reapply_due = False
                async with self._lock:
                    if self._requested is not None:
                        await self._apply(*self._requested)

        try:
            self._reapply = self._tasks.spawn(reapply(), name="late-grant")
        except RuntimeError:
            log.debug("late grant while shutting down: nothing left to advertise it on")

    async def _recheck(self) -> bool:
        """Apply the last plan again (a drained device disappears); whether any still drains."""
        async with self._lock:
            if self._requested is None:
                return False
            await self._apply(*self._requested)
            advertised = self._advertised
            return advertised is not None and bool(draining_ids(advertised, self._requested[0]))

    async def close(self) -> None:
        """Stop every resource server and remove its socket."""
        await self._tasks.close()
        async with self._lock:
            for name in list(self._servers):
                await self._stop(name)
            self._advertised = None
