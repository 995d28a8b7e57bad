"""Keeping the node's DRA pool published: one writer, always the newest pool.

The pool is a value of three inputs: what the node serves (`PoolState`, computed here from the
pipeline's `NodeView`: the plan with health applied, the GPUs and their faults), what the API
server keeps of a slice (`ServerFeatures`, owned here: a feature whose fields a write did not
keep is given up and the state computed again from the same view, without leaving this module),
and the devices prepared claims hold. Whatever changes one of them marks the pool dirty; one task
writes the newest pool, so a burst of reloads or health events is one write and two writers
never race. A failed write is retried with backoff (0.2 s doubling to 10 s by
default). Held devices the plan dropped stay published until their claim is unprepared (the
draining rule, `views.dra.pool_devices`), and so do the counter sets they consume from. Dynamic
MIG placements and their counter sets come from the state's `mig` (`views.dra_mig`).
Nothing is published before the kubelet confirmed the registration (a pod placed on a driver
it has not registered fails its prepare); `registered()` asks for a forced publish, which checks
the API and rewrites what the kubelet deleted. The kubelet also hears each device's health from
here (given a health service): the same inputs, at every change, whether or not the API answers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from sharing_plugin.config.base import SharedDevices
from sharing_plugin.config.memory import hook_path
from sharing_plugin.daemon.node.outcome import NodeView
from sharing_plugin.daemon.run_dra.features import ServerFeatures
from sharing_plugin.dra.health import DeviceHealthServicer
from sharing_plugin.dra.prepare import PoolState
from sharing_plugin.dra.slices import SlicePublisher
from sharing_plugin.errors import KubeApiError
from sharing_plugin.observability.status import StatusBoard
from sharing_plugin.views.dra import dra_devices, pool_devices
from sharing_plugin.views.dra_api import CounterSet, PublishedDevice
from sharing_plugin.views.dra_health import device_health, draining_taint, health_taints
from sharing_plugin.views.dra_mig import DynamicPool, dynamic_pool
from sharing_plugin.views.dra_shares import HeldShare, OldShares, old_shares, shares_notice

if TYPE_CHECKING:
    from sharing_plugin.observability.nodestatus import NodeStatusReporter

log = logging.getLogger(__name__)


class PoolWriter:
    """Publishes the pool through `publisher` whenever it changes; see the module docstring."""

    def __init__(
        self,
        publisher: SlicePublisher,
        *,
        features: ServerFeatures,
        held: Callable[[], Mapping[str, PublishedDevice]],
        status: StatusBoard,
        registered: Callable[[], bool],
        backoff_s: tuple[float, float] = (0.2, 10.0),
        health: DeviceHealthServicer | None = None,
        hook_path_default: str | None = None,
        held_shares: Callable[[], Sequence[HeldShare]] = tuple,
        node_events: NodeStatusReporter | None = None,
    ) -> None:
        """`features` is what the API server keeps, as discovered at start; from here on it is
        this keeper's (a write that did not keep a feature's fields gives the feature up).
        `hook_path_default` is where the CDI hook that caps memory is unless the config says.
        `held_shares` has one entry per share prepared claims hold (what was published for
        its device when prepared, what it consumed and asked). `node_events` files the Node
        events of the old shares."""
        self._hook_default = hook_path_default
        self._node_events = node_events
        self._held_shares = held_shares
        self._old_shares: tuple[OldShares, ...] = ()
        self.publisher = publisher
        self.features = features
        self._held = held
        self._health = health
        self._status = status
        self._registered = registered
        self._backoff_s = backoff_s
        self.state: PoolState | None = None
        self.node: NodeView | None = None
        """The node `state` was computed from."""
        self._dirty = asyncio.Event()
        self._force = False
        # Notified after each publish, for an observer to wait on; the keeper waits on nothing
        # of its own here.
        self._published = asyncio.Condition()
        self._counter_sets: dict[str, CounterSet] = {}  # last published, by name

    def state_for(self, node: NodeView) -> PoolState:
        """What serving `node` publishes, with what the server keeps now; PlanError for what
        the API cannot carry."""
        applied, keeps, driver = node.applied, self.features, self.publisher.driver
        shared = applied.config.dra.shared_devices if keeps.capacity else SharedDevices.REPLICAS
        # The config's dynamic GPUs as they are now (instances made since the last update
        # included), with the GPU and MIG devices that are unhealthy.
        unhealthy = {g.uuid for g in node.inventory.gpus if not g.healthy_at_discovery}
        mig = dynamic_pool(applied.config, node.inventory, unhealthy=unhealthy | node.unhealthy)
        devices = {
            d.name: d
            for d in dra_devices(node.plan, applied.inventory, shared=shared)
            if d.gpu_uuid not in mig.gpu_uuids  # a dynamic GPU is its placements only
        }
        if keeps.unpartitionable is not None:
            mig = DynamicPool()  # their GPUs are published as nothing else either
        taints, draining = None, None
        if keeps.taints:
            taints = health_taints(node.faults, driver)
            draining = draining_taint(driver)
        limits = applied.config.memory_limits
        return PoolState(
            devices=devices,
            plan=node.plan,
            flags=applied.config.flags,
            taints=taints,
            draining=draining,
            mig=mig,
            memory_hook_path=(
                hook_path(limits, self._hook_default)
                if (limits := applied.config.memory_limits).on
                else None
            ),
        )

    def serve(self, node: NodeView, state: PoolState) -> None:
        """A config was applied: the node serves `state` (`state_for(node)`) now."""
        if self.features.capacity:
            self._status.set_dra(shared_devices=node.applied.config.dra.shared_devices.value)
        self._set_state(node, state)

    def node_changed(self, node: NodeView) -> None:
        """The node changed under the config served (GPU health, a claim's MIG instance)."""
        self._set_state(node, self.state_for(node))

    def _set_state(self, node: NodeView, state: PoolState) -> None:
        self.node, self.state = node, state
        self._dirty.set()
        self._report_health()

    def changed(self) -> None:
        """The devices prepared claims hold changed."""
        self._dirty.set()
        self._report_health()

    def registered(self) -> None:
        """The kubelet (re)registered the plugin: make sure the API holds the pool."""
        self._force = True
        self._dirty.set()
        self._update_status()

    def pool(self) -> tuple[PublishedDevice, ...]:
        """What the pool should hold now: the plan's healthy devices (and its Unhealthy ones,
        tainted, where the server keeps taints) and the draining ones."""
        return self._pool()[1]

    def _pool(self) -> tuple[tuple[CounterSet, ...], tuple[PublishedDevice, ...]]:
        """The counter sets and the devices of the pool now."""
        held = self._held()
        state = self.state
        if state is None:
            return (), pool_devices((), held=held.keys(), kept=held)
        counters, placements = state.mig.published(held=held.keys(), taints=state.taints)
        dynamic = {d.name for d in placements}
        devices = tuple(state.devices.values())
        published = (
            pool_devices(
                devices,
                held=held.keys() - dynamic,
                kept=held,
                taints=state.taints,
                draining=state.draining,
            )
            + placements
        )
        sets = {c.name: c for c in counters}
        for device in published:  # a held device keeps the counter set it consumes from
            for name in device.consumes:
                if name not in sets and name in self._counter_sets:
                    sets[name] = self._counter_sets[name]
        self._counter_sets = sets
        return tuple(sets.values()), published

    async def run(self) -> None:
        """Publish every change until cancelled."""
        low, high = self._backoff_s
        delay = low
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            if not self._registered():
                # The scheduler places pods on what is published, and the kubelet fails the
                # prepare of a driver it has not registered (retrying only at its resync):
                # the confirmation marks the pool dirty again.
                continue
            force, self._force = self._force, False
            try:
                counters, devices = self._pool()
                await self.publisher.publish(devices, counter_sets=counters, force=force)
            except KubeApiError as exc:
                log.warning("publishing ResourceSlices: %s; retrying in %.1f s", exc, delay)
                self._force = self._force or force
                await asyncio.sleep(delay)
                delay = min(delay * 2, high)
                self._dirty.set()
                continue
            delay = low
            if self.features.dropped(self.publisher.dropped) and self.node is not None:
                self.node_changed(self.node)  # published again with what the server keeps
            self._update_status()
            async with self._published:
                self._published.notify_all()

    def _report_health(self) -> None:
        if self._health is None:
            return
        devices = self.state.devices.values() if self.state is not None else ()
        faults = self.node.faults if self.node is not None else {}
        self._health.publish(device_health(devices, faults, held=self._held()))

    def _update_status(self) -> None:
        """/status per resource: devices published, healthy ones, draining ones, registered."""
        published = self.publisher.published
        if published is None or self.state is None:
            return
        counts: dict[str, tuple[int, int, list[str]]] = {}
        for device in published:
            resource = str(device.attributes["resource"]["string"])
            total, healthy, draining = counts.get(resource, (0, 0, []))
            served = self.state.devices.get(device.name)
            if served is not None:
                counts[resource] = (total + 1, healthy + served.healthy, draining)
            elif self.state.mig.placement(device.name) is not None:
                healthy += self.state.mig.healthy(device.name)
                counts[resource] = (total + 1, healthy, draining)
            else:
                counts[resource] = (total + 1, healthy, [*draining, device.name])
        for name in set(self._status.resources) - set(counts):
            self._status.remove_resource(name)
        registered = self._registered()
        for name, (total, healthy, draining) in counts.items():
            self._status.set_resource(
                name, devices=total, healthy=healthy, draining=draining, registered=registered
            )
        self._report_old_shares()

    def _report_old_shares(self) -> None:
        """/status, the log and the Node: shared devices claims hold at another share than the
        config's (a replicas edit that takes full effect as they are released)."""
        if self.state is None:
            return
        found = old_shares(self.state.devices.values(), self._held_shares())
        if found == self._old_shares:
            return
        before, self._old_shares = self._old_shares, found
        self._status.set_dra_old_shares([o.to_json() for o in found])
        for device in found:
            log.warning("the config's share takes full effect as claims go: %s", device.message())
        notice = shares_notice(before, found)
        if notice is not None and self._node_events is not None:
            self._node_events.event(notice.reason, notice.message, warning=notice.warning)
