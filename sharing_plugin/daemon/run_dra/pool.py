"""Keeping the node's DRA pool published: one writer, always the newest pool.

The pool is a value of three inputs: what the node serves (`PoolState`: the plan with health
applied), and the devices prepared claims hold. Whatever changes one of them marks the pool
dirty; one task writes the newest pool, so a burst of reloads or health events is one write and
two writers never race. A failed write is retried with backoff (0.2 s doubling to 10 s by
default). Held devices the plan dropped stay published until their claim is unprepared (the
draining rule, `views.dra.pool_devices`), and so do the counter sets they consume from. Dynamic
MIG placements and their counter sets come from the state's `mig` (`views.dra_mig`).
`registered()` asks for a forced publish, which checks the API and rewrites what the kubelet
deleted. The kubelet also hears each device's health from here (given a health service): the
same inputs, at every change, whether or not the API answers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from sharing_plugin.dra.health import DeviceHealthServicer
from sharing_plugin.dra.prepare import PoolState
from sharing_plugin.dra.slices import SlicePublisher
from sharing_plugin.errors import KubeApiError
from sharing_plugin.gpus.health_tracker import Fault
from sharing_plugin.observability.status import StatusBoard
from sharing_plugin.views.dra import pool_devices
from sharing_plugin.views.dra_api import CounterSet, PublishedDevice
from sharing_plugin.views.dra_health import device_health

log = logging.getLogger(__name__)


class PoolKeeper:
    """Publishes the pool through `publisher` whenever it changes; see the module docstring."""

    def __init__(
        self,
        publisher: SlicePublisher,
        *,
        held: Callable[[], Mapping[str, PublishedDevice]],
        status: StatusBoard,
        registered: Callable[[], bool],
        backoff_s: tuple[float, float] = (0.2, 10.0),
        on_dropped: Callable[[frozenset[str]], None] = lambda _: None,
        health: DeviceHealthServicer | None = None,
        faults: Callable[[], Mapping[str, Fault]] = dict,
    ) -> None:
        """`on_dropped` hears which features the API server did not keep the fields of, each
        time that changes (a server with their feature gates off drops them on write).
        `faults` tells why each Unhealthy GPU or MIG device is so, for `health`."""
        self.publisher = publisher
        self._on_dropped = on_dropped
        self._dropped: frozenset[str] = frozenset()
        self._held = held
        self._health = health
        self._faults = faults
        self._status = status
        self._registered = registered
        self._backoff_s = backoff_s
        self.state: PoolState | None = None
        self._dirty = asyncio.Event()
        self._force = False
        # Notified after each publish, for an observer to wait on; the keeper waits on nothing
        # of its own here.
        self._published = asyncio.Condition()
        self._counter_sets: dict[str, CounterSet] = {}  # last published, by name

    def set_state(self, state: PoolState) -> None:
        """The node serves `state` now."""
        self.state = state
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
            if self.publisher.dropped != self._dropped:
                self._dropped = self.publisher.dropped
                self._on_dropped(self._dropped)
            self._update_status()
            async with self._published:
                self._published.notify_all()

    def _report_health(self) -> None:
        if self._health is None:
            return
        devices = self.state.devices.values() if self.state is not None else ()
        self._health.publish(device_health(devices, self._faults(), held=self._held()))

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
