"""The health monitor over the simulated NVML: Xids in, health changes out, recovery, env vars."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace

import pytest
from support.observe import inject_xid, set_lost

from sharing_plugin.config.model import Config, Health
from sharing_plugin.daemon.node.health_monitor import (
    HealthEnv,
    HealthMonitor,
    HealthSettings,
)
from sharing_plugin.gpus.health_tracker import RecoveryTiming, XidPolicy
from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.nvml.discover import discover
from sharing_plugin.observability.metrics import Metrics
from sharing_plugin.plan import plan
from sharing_plugin.sim.nvml.simulated import SimulatedNvml

DEFAULT_IGNORED = frozenset({13, 31, 43, 45, 68, 109})
SLOW = RecoveryTiming(quiet_period_s=60, first_check_s=30, max_check_s=300)
FAST = RecoveryTiming(quiet_period_s=0.2, first_check_s=0.05, max_check_s=0.1)


@dataclass
class Reports:
    """What `on_change` received, with a way to wait for the next one."""

    seen: list[dict[str, bool]] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, health: Mapping[str, bool]) -> None:
        self.seen.append(dict(health))
        self.arrived.set()

    async def next(self, within: float = 1.0) -> dict[str, bool]:
        await asyncio.wait_for(self.arrived.wait(), within)
        self.arrived.clear()
        return self.seen[-1]

    @property
    def last_unhealthy(self) -> set[str]:
        return {u for u, ok in self.seen[-1].items() if not ok} if self.seen else set()


@asynccontextmanager
async def running(
    sim: SimulatedNvml,
    inventory: Inventory,
    *,
    timing: RecoveryTiming = SLOW,
    metrics: Metrics | None = None,
) -> AsyncIterator[tuple[HealthMonitor, Reports]]:
    reports = Reports()
    monitor = HealthMonitor(
        sim,
        inventory,
        settings=HealthSettings(True, XidPolicy(DEFAULT_IGNORED), timing),
        on_change=reports,
        metrics=metrics,
        wait_ms=50,
    )
    task = asyncio.create_task(monitor.run(), name="test:health-monitor")
    try:
        await asyncio.wait_for(monitor.watching.wait(), 2.0)
        yield monitor, reports
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_critical_xid_marks_the_gpu_within_a_second() -> None:
    sim = SimulatedNvml.from_preset("dgx-a100-80gb")
    inventory = discover(sim)
    metrics = Metrics()
    async with running(sim, inventory, metrics=metrics) as (monitor, reports):
        started = asyncio.get_running_loop().time()
        inject_xid(sim, 2, 79)
        health = await reports.next()
        assert asyncio.get_running_loop().time() - started < 1.0
    assert {u for u, ok in health.items() if not ok} == {inventory.gpus[2].uuid}
    assert monitor.health == health
    text = metrics.render().decode()
    assert inventory.gpus[2].uuid in text


async def test_an_ignored_xid_changes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    sim = SimulatedNvml.from_preset("dgx-a100-80gb")
    inventory = discover(sim)
    caplog.set_level(logging.INFO)
    async with running(sim, inventory) as (_monitor, reports):
        inject_xid(sim, 2, 13)
        inject_xid(sim, 3, 48)  # a marker: once it is reported, Xid 13 was seen before it
        await reports.next()
    assert reports.last_unhealthy == {inventory.gpus[3].uuid}
    assert len(reports.seen) == 1
    assert "Xid 13 on" in caplog.text and "ignored" in caplog.text


async def test_a_mig_scoped_xid_marks_only_that_mig_device() -> None:
    sim = SimulatedNvml.from_preset("a100-mig-mixed")
    inventory = discover(sim)
    target = inventory.gpus[1].mig_devices[2]
    async with running(sim, inventory) as (_monitor, reports):
        inject_xid(sim, target.uuid, 94)
        await reports.next()
    assert reports.last_unhealthy == {target.uuid}


async def test_a_lost_gpu_is_unhealthy(caplog: pytest.LogCaptureFixture) -> None:
    sim = SimulatedNvml.from_preset("t4x4")
    inventory = discover(sim)
    async with running(sim, inventory) as (_monitor, reports):
        set_lost(sim, 1)
        await reports.next()
    assert reports.last_unhealthy == {inventory.gpus[1].uuid}
    assert f"GPU 1 ({inventory.gpus[1].uuid}) marked Unhealthy" in caplog.text


async def test_a_gpu_lost_before_the_watch_is_found_by_a_check() -> None:
    sim = SimulatedNvml.from_preset("t4x4")
    inventory = discover(sim)
    set_lost(sim, 3)  # no event set holds it yet: only the check at start can tell
    async with running(sim, inventory) as (_monitor, reports):
        await reports.next()
    assert reports.last_unhealthy == {inventory.gpus[3].uuid}


async def test_recovery_after_the_quiet_period(caplog: pytest.LogCaptureFixture) -> None:
    sim = SimulatedNvml.from_preset("t4x4")
    inventory = discover(sim)
    caplog.set_level(logging.INFO)
    async with running(sim, inventory, timing=FAST) as (_monitor, reports):
        loop = asyncio.get_running_loop()
        set_lost(sim, 0)
        await reports.next()
        lost_at = loop.time()
        assert reports.last_unhealthy == {inventory.gpus[0].uuid}
        # Checks that fail while it is still lost (two of them) leave it Unhealthy.
        async with asyncio.timeout(2):
            while sum("still Unhealthy" in r.getMessage() for r in caplog.records) < 2:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        assert reports.last_unhealthy == {inventory.gpus[0].uuid}
        set_lost(sim, 0, False)
        answered_at = loop.time()
        health = await reports.next(within=2.0)
        assert all(health.values())
        assert loop.time() - answered_at >= 0.1  # quiet since the last failed check
        assert loop.time() - lost_at >= FAST.quiet_period_s
    assert "is Healthy again" in caplog.text


async def test_a_new_xid_during_the_quiet_period_postpones_recovery() -> None:
    sim = SimulatedNvml.from_preset("workstation")
    inventory = discover(sim)
    timing = RecoveryTiming(quiet_period_s=0.4, first_check_s=0.05, max_check_s=0.1)
    async with running(sim, inventory, timing=timing) as (monitor, reports):
        loop = asyncio.get_running_loop()
        inject_xid(sim, 0, 48)
        await reports.next()
        await asyncio.sleep(0.25)
        inject_xid(sim, 0, 48)
        again = loop.time()
        await reports.next(within=2.0)
        assert all(monitor.health.values())
        assert loop.time() - again >= 0.4


async def test_health_applied_to_a_plan_takes_exactly_the_gpus_devices() -> None:
    sim = SimulatedNvml.from_preset("a100-mig-mixed")
    inventory = discover(sim)
    config = Config.model_validate(
        {
            "version": "v1",
            "flags": {"migStrategy": "mixed"},
            "sharing": {
                "timeSlicing": {"resources": [{"name": "nvidia.com/mig-1g.10gb", "replicas": 3}]}
            },
        }
    )
    base = plan(config, inventory)
    gpu = inventory.gpus[1]  # 3g.40gb + 2g.20gb + 1g.10gb: three resources
    async with running(sim, inventory) as (_monitor, reports):
        inject_xid(sim, 1, 79)
        health = await reports.next()
    after = base.with_health(health)
    touched = set()
    for before_res, after_res in zip(base.resources, after.resources, strict=True):
        for b, a in zip(before_res.devices, after_res.devices, strict=True):
            assert a.healthy == (b.healthy and b.gpu_uuid != gpu.uuid), a.id
            if b.gpu_uuid == gpu.uuid:
                touched.add(after_res.name)
        assert after_res.healthy_count == before_res.healthy_count - sum(
            1 for d in before_res.devices if d.gpu_uuid == gpu.uuid
        )
    assert touched == {"nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb", "nvidia.com/mig-3g.40gb"}


async def test_turning_health_checks_off_reports_everything_healthy() -> None:
    sim = SimulatedNvml.from_preset("t4x4")
    inventory = discover(sim)
    async with running(sim, inventory) as (monitor, reports):
        inject_xid(sim, 2, 79)
        await reports.next()
        monitor.update_settings(replace(monitor.settings, enabled=False))
        health = await reports.next()
        assert all(health.values())
        inject_xid(sim, 2, 79)  # not watched now
        monitor.update_settings(replace(monitor.settings, enabled=True))
        await asyncio.wait_for(monitor.watching.wait(), 2.0)
        inject_xid(sim, 1, 79)
        await reports.next()
    assert reports.last_unhealthy == {inventory.gpus[1].uuid}


async def test_new_ignored_xids_apply_to_the_next_event() -> None:
    sim = SimulatedNvml.from_preset("t4x4")
    inventory = discover(sim)
    async with running(sim, inventory) as (monitor, reports):
        monitor.update_settings(replace(monitor.settings, policy=XidPolicy(frozenset({48}))))
        inject_xid(sim, 0, 48)
        inject_xid(sim, 1, 13)
        await reports.next()
    assert reports.last_unhealthy == {inventory.gpus[1].uuid}
    assert len(reports.seen) == 1


# ---- the reference plugin's environment variables ----


@pytest.mark.parametrize(
    ("environ", "enabled", "critical", "ignored"),
    [
        ({}, True, {48, 79}, {13, 31, 43, 45, 68, 109}),
        ({"DP_DISABLE_HEALTHCHECKS": "all"}, False, set(), set()),
        ({"DP_DISABLE_HEALTHCHECKS": "XIDS"}, False, set(), set()),
        ({"DP_DISABLE_HEALTHCHECKS": "48, 79,"}, True, {94}, {13, 48, 79}),
        ({"DP_ENABLE_HEALTHCHECKS": "13,31"}, True, {13, 31, 48}, {43, 109}),
        ({"DP_ENABLE_HEALTHCHECKS": "all"}, True, {13, 31, 43, 48}, set()),
        (
            {"DP_DISABLE_HEALTHCHECKS": "all", "DP_ENABLE_HEALTHCHECKS": "79"},
            True,
            {79},
            {13, 48, 94},
        ),
        ({"DP_DISABLE_HEALTHCHECKS": "48", "DP_ENABLE_HEALTHCHECKS": "48"}, True, {48}, {13}),
    ],
)
def test_environment_variables(
    environ: dict[str, str], enabled: bool, critical: set[int], ignored: set[int]
) -> None:
    settings = HealthEnv.from_environ(environ).settings(Health())
    assert settings.enabled is enabled
    if enabled:
        assert {x for x in critical if settings.policy.is_critical(x)} == critical
        assert {x for x in ignored if not settings.policy.is_critical(x)} == ignored


def test_config_timing_and_enabled_flow_into_the_settings() -> None:
    health = Health.model_validate(
        {"enabled": False, "recoveryQuietPeriodSeconds": 5, "recoveryCheckSeconds": 2}
    )
    settings = HealthEnv().settings(health)
    assert not settings.enabled
    assert settings.timing == RecoveryTiming(quiet_period_s=5, first_check_s=2, max_check_s=300)
    assert not HealthEnv.from_environ({"DP_ENABLE_HEALTHCHECKS": "all"}).settings(health).enabled


def test_malformed_environment_entries_are_said() -> None:
    env = HealthEnv.from_environ({"DP_DISABLE_HEALTHCHECKS": "48,bogus"})
    assert not env.settings(Health()).policy.is_critical(48)
    assert env.problems == (
        "DP_DISABLE_HEALTHCHECKS: 'bogus' is not an Xid number or 'all'; it is ignored",
    )
    assert HealthEnv.from_environ({"DP_DISABLE_HEALTHCHECKS": "48"}).describe() == (
        "DP_DISABLE_HEALTHCHECKS ignores Xids [48]"
    )
