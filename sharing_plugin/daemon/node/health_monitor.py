"""The health monitor: NVML Xid and ECC events and recovery checks fed to the health state
machine.

The state machine decides; this module does the waiting and the NVML calls. Two tasks run
while health checking is on: one consumes the NVML event watch (the event types the config's
``health.eventTypes`` names; all of them by default, as in the reference), one sleeps until the
earliest recovery check is due (there is no periodic tick: with every GPU Healthy it waits for
nothing but a wake-up) and queries NVML in a worker thread, since a GPU that is falling off the
bus can block an NVML call for seconds. Every change is logged once and handed, as the whole
health mapping, to `on_change`, which pushes it to kubelet.

The reference plugin's environment variables ``DP_DISABLE_HEALTHCHECKS`` and
``DP_ENABLE_HEALTHCHECKS`` are honoured for compatibility; they are read once, at start, by
`HealthEnv.from_environ`, and combined with each loaded config by `HealthEnv.settings`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sharing_plugin.config.model import EventType, Health
from sharing_plugin.errors import NvmlError
from sharing_plugin.gpus.health_tracker import (
    EVERY_EVENT_KIND,
    EventKind,
    Fault,
    HealthChange,
    HealthTracker,
    RecoveryTiming,
    XidPolicy,
)
from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.nvml.api import NvmlApi
from sharing_plugin.nvml.calls import nvml_errors, nvml_session
from sharing_plugin.nvml.events import EVENT_WAIT_MS, NvmlEvent, NvmlEventWatch, describe_kinds
from sharing_plugin.observability.metrics import Metrics

log = logging.getLogger(__name__)

ENV_DISABLE = "DP_DISABLE_HEALTHCHECKS"
ENV_ENABLE = "DP_ENABLE_HEALTHCHECKS"
_ALL = ("all", "xids")  # the reference accepts both words for "every Xid"
_EVENT_KIND = {
    EventType.XID_CRITICAL_ERROR: EventKind.XID,
    EventType.DOUBLE_BIT_ECC_ERROR: EventKind.DOUBLE_BIT_ECC,
    EventType.SINGLE_BIT_ECC_ERROR: EventKind.SINGLE_BIT_ECC,
}


def event_kinds(health: Health) -> frozenset[EventKind]:
    """The NVML event kinds `health.eventTypes` asks for; none given (or an empty list): every
    kind, as the reference plugin registers by default."""
    return frozenset(_EVENT_KIND[t] for t in health.event_types or ()) or EVERY_EVENT_KIND


@dataclass(frozen=True, slots=True)
class HealthSettings:
    """Everything the monitor needs to know from the config and the environment."""

    enabled: bool = True
    policy: XidPolicy = field(default_factory=XidPolicy)
    timing: RecoveryTiming = field(default_factory=RecoveryTiming)
    event_kinds: frozenset[EventKind] = EVERY_EVENT_KIND


@dataclass(frozen=True, slots=True)
class HealthEnv:
    """The reference plugin's health variables, parsed.

    ``DP_DISABLE_HEALTHCHECKS``: ``all`` (or ``xids``) turns health checking off; a comma list
    of Xids adds them to the ignored ones. ``DP_ENABLE_HEALTHCHECKS``: a comma list of Xids
    that count even when ignored (by the config or the other variable); ``all`` makes every Xid
    count. With ``DP_DISABLE_HEALTHCHECKS=all`` it selects the only Xids that count, as the
    reference documents (its code then turns health checking off altogether).
    """

    disable_all: bool = False
    disabled: frozenset[int] = frozenset()
    enable_all: bool = False
    enabled: frozenset[int] = frozenset()
    problems: tuple[str, ...] = ()  # malformed entries, for the log

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> HealthEnv:
        disable_all, disabled, bad_d = _parse(ENV_DISABLE, environ.get(ENV_DISABLE, ""))
        enable_all, enabled, bad_e = _parse(ENV_ENABLE, environ.get(ENV_ENABLE, ""))
        return cls(disable_all, disabled, enable_all, enabled, bad_d + bad_e)

    def settings(self, health: Health) -> HealthSettings:
        """The config's health section with these variables applied. `DP_ENABLE_HEALTHCHECKS=all`
        makes every Xid count, whatever `criticalXIDs` lists."""
        timing = RecoveryTiming(
            quiet_period_s=float(health.recovery_quiet_period_seconds),
            first_check_s=float(health.recovery_check_seconds),
            max_check_s=float(health.recovery_check_max_seconds),
        )
        kinds = event_kinds(health)
        if self.enable_all:
            return HealthSettings(health.enabled, XidPolicy(), timing, kinds)
        if self.disable_all:
            if not self.enabled:
                policy = XidPolicy(frozenset(health.ignored_xids))
                return HealthSettings(False, policy, timing, kinds)
            return HealthSettings(health.enabled, XidPolicy(only=self.enabled), timing, kinds)
        ignored = (frozenset(health.ignored_xids) | self.disabled) - self.enabled
        if health.critical_xids is not None:
            # The config's criticalXIDs: only those count, an ignored one never (as in the
            # reference), and the Xids DP_ENABLE_HEALTHCHECKS names count as well.
            only = (frozenset(health.critical_xids) - ignored) | self.enabled
            return HealthSettings(health.enabled, XidPolicy(only=only), timing, kinds)
        return HealthSettings(health.enabled, XidPolicy(ignored), timing, kinds)

    def describe(self) -> str | None:
        """One log line on what the variables change; None when neither is set."""
        parts = []
        if self.disable_all:
            parts.append(f"{ENV_DISABLE}=all")
        elif self.disabled:
            parts.append(f"{ENV_DISABLE} ignores Xids {sorted(self.disabled)}")
        if self.enable_all:
            parts.append(f"{ENV_ENABLE}=all: every Xid counts")
        elif self.enabled:
            parts.append(f"{ENV_ENABLE} counts Xids {sorted(self.enabled)}")
        return "; ".join(parts) or None


def _parse(name: str, value: str) -> tuple[bool, frozenset[int], tuple[str, ...]]:
    xids: set[int] = set()
    problems: list[str] = []
    for item in value.lower().split(","):
        word = item.strip()
        if not word:
            continue
        if word in _ALL:
            return True, frozenset(), ()
        if word.isdigit():
            xids.add(int(word))
        else:
            problems.append(f"{name}: '{word}' is not an Xid number or 'all'; it is ignored")
    return False, frozenset(xids), tuple(problems)


OnChange = Callable[[Mapping[str, bool]], Awaitable[None]]


class HealthMonitor:
    """Watches the inventory's GPUs and reports health changes through `on_change`.

    ``await monitor.run()`` runs until cancelled (spawn it as an eternal task). `health` is the
    current mapping (every GPU and MIG UUID -> Healthy); `update_settings` and
    `update_inventory` take effect at once, restarting the event watch when needed.
    """

    def __init__(
        self,
        nvml: NvmlApi,
        inventory: Inventory,
        *,
        settings: HealthSettings,
        on_change: OnChange,
        metrics: Metrics | None = None,
        clock: Callable[[], float] | None = None,
        wait_ms: int = EVENT_WAIT_MS,
    ) -> None:
        self._nvml = nvml
        self._settings = settings
        self._tracker = HealthTracker(inventory, policy=settings.policy, timing=settings.timing)
        self._on_change = on_change
        self._metrics = metrics
        self._clock = clock
        self._wait_ms = wait_ms
        self._restart = asyncio.Event()
        self._wake = asyncio.Event()
        self._publish_lock = asyncio.Lock()
        self._watch_down = False
        self.watching = asyncio.Event()
        """Set while the NVML event watch is registered (tests and start-up wait on it)."""

    @property
    def health(self) -> Mapping[str, bool]:
        return self._tracker.health

    @property
    def faults(self) -> Mapping[str, Fault]:
        """Every Unhealthy GPU or MIG UUID -> why (read by `on_change` with the health)."""
        return self._tracker.faults

    @property
    def settings(self) -> HealthSettings:
        return self._settings

    def update_settings(self, settings: HealthSettings) -> None:
        """New ignored Xids and timings apply to the next event and check; turning health
        checking off reports every device Healthy, turning it on starts watching again, and
        other event types are registered on a new watch."""
        before, self._settings = self._settings, settings
        self._tracker.policy = settings.policy
        self._tracker.timing = settings.timing
        if (before.enabled, before.event_kinds) != (settings.enabled, settings.event_kinds):
            self._restart.set()
        self._wake.set()

    def update_inventory(self, inventory: Inventory) -> None:
        """Follow a rediscovered inventory (e.g. after a MIG change): the watch restarts so
        events on new MIG devices are attributed to them."""
        self._tracker.use_inventory(inventory)
        self._restart.set()

    async def run(self) -> None:
        clock = self._clock or asyncio.get_running_loop().time
        if self._metrics is not None:
            for uuid, healthy in self.health.items():
                self._metrics.set_gpu_healthy(uuid, healthy)
        while True:
            self._restart.clear()
            self.watching.clear()
            if not self._settings.enabled:
                log.info("GPU health checks are off (health.enabled or %s)", ENV_DISABLE)
                await self._publish(self._tracker.reset())
                await self._restart.wait()
                continue
            tasks = [
                asyncio.create_task(self._watch(clock), name="health:nvml-events"),
                asyncio.create_task(self._recheck(clock), name="health:recovery-checks"),
                asyncio.create_task(self._restart.wait(), name="health:restart"),
            ]
            try:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in tasks:
                    task.cancel()
                await _ended(tasks)
            for task in done:
                task.result()  # a bug in a loop surfaces here; a restart returns None

    # ---- NVML events ----

    async def _watch(self, clock: Callable[[], float]) -> None:
        timing = self._settings.timing
        kinds = self._settings.event_kinds
        delay = timing.first_check_s
        while True:
            inventory = self._tracker.inventory
            try:
                async with NvmlEventWatch(
                    self._nvml, inventory, wait_ms=self._wait_ms, kinds=kinds
                ) as watch:
                    self._watch_down = False
                    self.watching.set()
                    delay = timing.first_check_s
                    log.info(
                        "GPU health: watching %s events of %d GPUs; %s",
                        describe_kinds(kinds),
                        len(inventory.gpus) - len(watch.unwatched),
                        _policy_text(self._settings.policy)
                        if EventKind.XID in kinds
                        else "Xids are not watched (health.eventTypes)",
                    )
                    for uuid in watch.unwatched:
                        problem = await asyncio.to_thread(self._query, uuid)
                        if problem is not None:
                            await self._publish(
                                self._tracker.on_lost(uuid, clock(), detail=problem)
                            )
                    async for event in watch:
                        await self._on_event(event, clock())
            except NvmlError as exc:
                self._watch_down = True
                self.watching.clear()
                change = self._tracker.on_lost(None, clock(), detail=f"no NVML events ({exc})")
                log.error(
                    "GPU health: cannot watch NVML events (%s): every GPU stays Unhealthy until "
                    "the watch works again (retry in %gs); set health.enabled: false to run "
                    "without health checks",
                    exc,
                    delay,
                )
                await self._publish(change)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._settings.timing.max_check_s)

    async def _on_event(self, event: NvmlEvent, now: float) -> None:
        if event.kind is not EventKind.XID:
            if self._metrics is not None:
                self._metrics.count_ecc_event(event.uuid, event.kind.value)
            if event.kind is EventKind.SINGLE_BIT_ECC:
                log.info(
                    "GPU health: single-bit ECC error on %s, corrected by the GPU; its health "
                    "is unchanged",
                    event.uuid,
                )
            await self._publish(self._tracker.on_ecc(event.uuid, event.kind, now))
            return
        if self._metrics is not None:
            self._metrics.count_health_event(event.uuid, event.xid)
        if not self._tracker.policy.is_critical(event.xid):
            log.info("GPU health: Xid %d on %s ignored (not a GPU fault)", event.xid, event.uuid)
            return
        await self._publish(self._tracker.on_xid(event.uuid, event.xid, now))

    # ---- recovery checks ----

    async def _recheck(self, clock: Callable[[], float]) -> None:
        while True:
            self._wake.clear()
            deadline = self._tracker.next_deadline()
            wait = None if deadline is None else deadline - clock()
            if wait is None or wait > 0:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancellation
                # that arrives together with the wake-up, and this loop would never end.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await self._wake.wait()
                continue
            for uuid in self._tracker.due_checks(clock()):
                problem = await asyncio.to_thread(self._query, uuid)
                if problem is None and self._watch_down:
                    problem = "NVML events cannot be watched"
                if problem is not None:
                    log.info("GPU health: %s still Unhealthy: %s", uuid, problem)
                answered = problem is None
                await self._publish(self._tracker.on_check(uuid, answered, clock()))

    def _query(self, uuid: str) -> str | None:
        """A cheap NVML query of one device; None when it answers, else NVML's words. Runs in a
        worker thread: NVML counts initialisations, so this session does not disturb the event
        watch's own."""
        nvml = self._nvml
        try:
            with nvml_session(nvml), nvml_errors(nvml, f"checking {uuid}"):
                handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
                nvml.nvmlDeviceGetName(handle)
                nvml.nvmlDeviceGetMemoryInfo(handle)
        except NvmlError as exc:
            return str(exc)
        return None

    # ---- reporting ----

    async def _publish(self, change: HealthChange | None) -> None:
        self._wake.set()
        if change is None:
            return
        if change.healthy:
            log.info("GPU health: %s", change.message)
        else:
            log.warning("GPU health: %s", change.message)
        if self._metrics is not None:
            for uuid in change.devices:
                self._metrics.set_gpu_healthy(uuid, change.healthy)
        async with self._publish_lock:
            try:
                await self._on_change(self.health)
            except Exception:  # the monitor must outlive a failed push; the next one retries
                log.exception("GPU health: reporting a health change failed")


async def _ended(tasks: list[asyncio.Task[Any]]) -> None:
    """Wait until cancelled tasks have ended, even when cancelled again meanwhile (a stop
    during a restart). A gather would pass the second cancellation on and return at once,
    leaving the watch and check tasks running after the monitor has ended. Closing the event
    watch does not wait for NVML, so this wait is short."""
    pending = set(tasks)
    cancelled = False
    while pending:
        try:
            _, pending = await asyncio.wait(pending)
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError


def _policy_text(policy: XidPolicy) -> str:
    if policy.only is not None:
        return f"only Xids {sorted(policy.only)} count"
    if policy.ignored:
        return f"ignoring Xids {sorted(policy.ignored)}"
    return "every Xid counts"
