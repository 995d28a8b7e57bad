"""run-dra in-process with dynamic MIG and declared layouts: what the pool publishes, and what
preparing and unpreparing claims does to the simulated GPUs (its record of MIG calls and its
instances). Claims are allocated by hand here, as the scheduler would write them (the test
allocator knows no partitionable devices); the real 1.36 allocator's tests are in tests/e2e.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import append_fault, node_file
from dra_harness import DRIVER, NODE, DraRun, dra_running
from kube_api import FakeKubeApi
from support.observe import health_monitor, next_applied, recording_backend, wait_published

from sharing_plugin.backends import backend_from_spec
from sharing_plugin.dra.claims import ClaimRef
from sharing_plugin.nvml.discover import discover
from sharing_plugin.nvml.mig_ops import create_compute_instance, create_gpu_instance
from sharing_plugin.sim.nvml.simulated import SimulatedNvml
from sharing_plugin.views.dra_mig import counter_set_name, placement_name

A100 = "simulated:a100-mig-mixed"  # GPU 0: 3g.40gb@0 2g.20gb@4 1g.10gb@6; GPU 3: MIG on, empty
MIXED = discover(SimulatedNvml.from_preset("a100-mig-mixed"))
GPU0, GPU3 = MIXED.gpus[0].uuid, MIXED.gpus[3].uuid
GI_1_SLICE, CI_1_SLICE = 0, 0
Call = tuple[str, int, str | None, int | None]


def dynamic(devices: str) -> str:
    return f"version: v1\npartitioning:\n  mig:\n    - devices: {devices}\n      dynamic: true\n"


def claim(run: DraRun, name: str, *devices: str) -> ClaimRef:
    """A claim allocated `devices` of this node's pool, as the scheduler stores it."""
    results = [{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": d} for d in devices]
    stored = run.api.put_dra_object(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"devices": {"requests": []}},
            "status": {"allocation": {"devices": {"results": results}}},
        }
    )
    return ClaimRef("default", name, stored["metadata"]["uid"])


def calls(run: DraRun) -> list[Call]:
    made = list(run.nvml.mig_calls)
    run.nvml.mig_calls.clear()
    return [(c.op, c.gpu, c.profile, c.start) for c in made if c.result == "SUCCESS"]


def instances(run: DraRun, gpu: int) -> list[str]:
    return sorted(f"{gi.spec.name}@{gi.start}" for gi in run.nvml.gpus[gpu].gpu_instances)


def counters(run: DraRun, gpu_uuid: str) -> dict[str, int]:
    name = counter_set_name(gpu_uuid)
    for s in run.slices():
        for found in s["spec"].get("sharedCounters") or ():
            if found["name"] == name:
                return {k: int(v["value"]) for k, v in found["counters"].items()}
    raise AssertionError(f"no counter set {name} published")


def device(run: DraRun, name: str) -> dict[str, Any]:
    return next(
        d for s in run.slices() for d in s["spec"].get("devices") or () if d["name"] == name
    )


def spec_env(run: DraRun, uid: str) -> list[str]:
    spec = json.loads((run.root / "cdi" / f"{DRIVER}-claim_{uid}.json").read_text())
    (cdi,) = spec["devices"]
    env: list[str] = cdi["containerEdits"]["env"]
    return env


WHOLE = 1 + 5  # migStrategy none: the A100-40GB with MIG off, and the other four whole


async def test_a_dynamic_gpu_is_published_as_its_placements_over_one_counter_set(
    short_dir: Path,
) -> None:
    async with dra_running(short_dir, dynamic("[3]"), gpus=A100) as run:
        published = await run.published(WHOLE - 1 + 25)
        names = {d.name for d in published}
        assert f"{GPU3.lower()}" not in names  # GPU 3 is its placements only
        assert placement_name(GPU3, "7g.80gb", 0) in names
        first, second = run.slices()
        assert "devices" not in first["spec"] and "sharedCounters" not in second["spec"]
        (counter_set,) = first["spec"]["sharedCounters"]
        assert counter_set["name"] == counter_set_name(GPU3)
        assert counters(run, GPU3) == {
            **{f"memory-slice-{i}": 1 for i in range(8)},
            "compute-slices": 7,
            "media-extensions": 1,
        }
        assert first["spec"]["pool"]["resourceSliceCount"] == 2
        seven = device(run, placement_name(GPU3, "7g.80gb", 0))
        assert seven["attributes"]["migStart"] == {"int": 0}
        assert seven["consumesCounters"] == [
            {
                "counterSet": counter_set_name(GPU3),
                "counters": {
                    **{f"memory-slice-{i}": {"value": "1"} for i in range(8)},
                    "compute-slices": {"value": "7"},
                },
            }
        ]
        assert calls(run) == []  # MIG mode was on already: nothing to do until a claim
        status = run.daemon.status.to_json()["resources"]
        assert status["nvidia.com/mig-1g.10gb"] == {
            "devices": 7,
            "healthy": 7,
            "draining": [],
            "registered": True,
        }


async def test_a_server_that_drops_the_counters_gets_no_placements(
    short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with FakeKubeApi() as api:
        # A 1.34-1.35 server with DRAPartitionableDevices off stores the placements without
        # their counters: the scheduler would then allocate overlapping instances.
        api.dra_features_off = frozenset({"DRAPartitionableDevices"})
        async with dra_running(short_dir, dynamic("[3]"), gpus=A100, api=api) as run:
            published = await wait_published(run.keeper, lambda d: len(d) == WHOLE - 1)
            assert not any(GPU3 in str(d.attributes["uuid"]) for d in published)
            stored = [d for s in run.slices() for d in s["spec"].get("devices") or ()]
            assert len(stored) == WHOLE - 1
            assert not any(s["spec"].get("sharedCounters") for s in run.slices())
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("DRAPartitionableDevices" in m and "not published" in m for m in said), said


async def test_prepare_creates_the_instance_and_unprepare_destroys_it(short_dir: Path) -> None:
    async with dra_running(short_dir, dynamic("[3]"), gpus=A100) as run:
        await run.published(WHOLE - 1 + 25)
        three = placement_name(GPU3, "3g.40gb", 4)
        ref = claim(run, "train", three)
        answer = await run.prepare(ref)
        assert answer.error == ""
        assert [d["device"] for d in answer.devices] == [three]
        assert instances(run, 3) == ["3g.40gb@4"]
        assert calls(run) == [
            ("create_gpu_instance", 3, "3g.40gb", 4),
            ("create_compute_instance", 3, "3g.40gb", 4),
        ]
        (mig,) = discover(run.nvml).gpus[3].mig_devices
        assert spec_env(run, ref.uid) == [f"NVIDIA_VISIBLE_DEVICES={mig.uuid}"]
        # Held: the allocator counts it now, so the counters are whole and it consumes.
        await wait_published(run.keeper, lambda d: any(x.name == three and x.consumes for x in d))
        assert counters(run, GPU3)["compute-slices"] == 7
        assert run.daemon.pipeline.inventory is not None
        assert run.daemon.pipeline.inventory.mig_device(mig.uuid) is not None

        assert await run.unprepare(ref) == ""
        assert instances(run, 3) == []
        assert calls(run) == [
            ("destroy_compute_instance", 3, "3g.40gb", 4),
            ("destroy_gpu_instance", 3, "3g.40gb", 4),
        ]
        assert not (run.root / "cdi" / f"{DRIVER}-claim_{ref.uid}.json").exists()
        assert 'operation="destroy-gpu-instance",result="ok"} 1.0' in (
            run.daemon.metrics.render().decode()
        )


async def test_a_claim_nvml_refuses_fails_with_its_reason_and_leaves_the_gpu(
    short_dir: Path,
) -> None:
    async with dra_running(short_dir, dynamic("[3]"), gpus=A100) as run:
        await run.published(WHOLE - 1 + 25)
        # Someone takes slice 0 behind the plugin's back (nvidia-smi mig -cgi ...).
        gi = create_gpu_instance(run.nvml, GPU3, profile_index=GI_1_SLICE, start=0)
        create_compute_instance(run.nvml, GPU3, gi_id=gi, ci_profile_index=CI_1_SLICE)
        calls(run)
        # Its first placement fits, the second needs slice 0: neither is left behind.
        ref = claim(
            run, "big", placement_name(GPU3, "3g.40gb", 4), placement_name(GPU3, "4g.40gb", 0)
        )
        answer = await run.prepare(ref)
        assert answer.devices == ()
        assert "creating MIG instance 4g.40gb@0 on GPU 3" in answer.error
        assert "NVML_ERROR_INSUFFICIENT_RESOURCES" in answer.error
        assert instances(run, 3) == ["1g.10gb@0"]
        assert calls(run) == [
            ("create_gpu_instance", 3, "3g.40gb", 4),
            ("create_compute_instance", 3, "3g.40gb", 4),
            ("destroy_compute_instance", 3, "3g.40gb", 4),
            ("destroy_gpu_instance", 3, "3g.40gb", 4),
        ]
        assert not (run.root / "cdi" / f"{DRIVER}-claim_{ref.uid}.json").exists()
        assert run.daemon.preparer is not None and run.daemon.preparer.prepared == {}


async def test_existing_instances_are_adopted_and_destroyed_at_unprepare(short_dir: Path) -> None:
    async with dra_running(short_dir, dynamic("[0]"), gpus=A100) as run:
        await run.published(WHOLE - 1 + 25)
        three = placement_name(GPU0, "3g.40gb", 0)
        # Its three instances take their slices off the counters; their devices consume nothing.
        assert counters(run, GPU0)["memory-slice-0"] == 0
        assert "consumesCounters" not in device(run, three)
        ref = claim(run, "adopt", three)
        answer = await run.prepare(ref)
        assert answer.error == ""
        assert calls(run) == []  # adopted, not made again
        mig = MIXED.gpus[0].mig_devices[0]
        assert spec_env(run, ref.uid) == [f"NVIDIA_VISIBLE_DEVICES={mig.uuid}"]
        await wait_published(run.keeper, lambda d: any(x.name == three and x.consumes for x in d))
        assert counters(run, GPU0)["memory-slice-0"] == 1  # the allocator counts it now
        assert await run.unprepare(ref) == ""
        assert instances(run, 0) == ["1g.10gb@6", "2g.20gb@4"]
        await wait_published(run.keeper, lambda d: True)
        assert [counters(run, GPU0)[f"memory-slice-{i}"] for i in range(4)] == [1] * 4


async def test_a_restart_keeps_the_instance_and_unprepares_it(short_dir: Path) -> None:
    nvml = recording_backend(A100)  # the GPUs outlive the plugin
    seven = placement_name(GPU3, "7g.80gb", 0)
    async with FakeKubeApi() as api:
        async with dra_running(short_dir, dynamic("[3]"), api=api, nvml=nvml) as run:
            await run.published(WHOLE - 1 + 25)
            ref = claim(run, "long", seven)
            answer = await run.prepare(ref)
            assert answer.error == ""
        assert instances(run, 3) == ["7g.80gb@0"]
        async with dra_running(short_dir, dynamic("[3]"), api=api, nvml=nvml) as run:
            published = await run.published(WHOLE - 1 + 25)
            assert next(d for d in published if d.name == seven).consumes  # held, counted
            assert counters(run, GPU3)["compute-slices"] == 7
            assert (await run.prepare(ref)).devices == answer.devices  # from the checkpoint
            calls(run)
            assert await run.unprepare(ref) == ""
            assert instances(run, 3) == []
            assert calls(run) == [
                ("destroy_compute_instance", 3, "7g.80gb", 0),
                ("destroy_gpu_instance", 3, "7g.80gb", 0),
            ]


async def test_a_dynamic_gpu_with_mig_off_gets_mig_mode_first(short_dir: Path) -> None:
    gpus = "simulated:dgx-a100-80gb"
    async with dra_running(short_dir, dynamic("[0, 1]"), gpus=gpus) as run:
        await run.published(6 + 2 * 25)
        assert calls(run) == [("set_mig_mode", 0, None, None), ("set_mig_mode", 1, None, None)]
        status = run.daemon.status.to_json()["mig"]
        assert {s["state"] for s in status.values()} == {"applied"} and len(status) == 2


async def test_a_v1beta1_server_refuses_a_dynamic_entry_before_touching_the_gpu(
    short_dir: Path,
) -> None:
    gpus = "simulated:dgx-a100-80gb"  # MIG off: a dynamic entry would turn it on
    async with dra_running(
        short_dir, dynamic("[0]"), gpus=gpus, versions=("v1beta1",), wait_registered=False
    ) as run:
        assert calls(run) == []
        error = run.daemon.status.last_error or ""
        assert error == (
            f"{run.config}:5:7: partitioning.mig[0].dynamic: dynamic MIG needs partitionable "
            "devices (resource.k8s.io/v1, Kubernetes 1.34+); this API server serves only "
            "resource.k8s.io/v1beta1: remove dynamic and declare profiles"
        )


# ---- declared layouts in DRA mode ------------------------------------------------------------


def declared(profiles: str) -> str:
    return (
        "version: v1\nflags:\n  migStrategy: mixed\npartitioning:\n  mig:\n"
        f"    - devices: [3]\n      profiles: {profiles}\n"
    )


async def test_a_declared_layout_is_applied_and_waits_for_the_claim_on_its_instance(
    short_dir: Path,
) -> None:
    async with dra_running(short_dir, declared("{3g.40gb: 2}"), gpus=A100) as run:
        assert calls(run) == [
            ("create_gpu_instance", 3, "3g.40gb", 0),
            ("create_compute_instance", 3, "3g.40gb", 0),
            ("create_gpu_instance", 3, "3g.40gb", 4),
            ("create_compute_instance", 3, "3g.40gb", 4),
        ]
        published = await wait_published(
            run.keeper,
            lambda d: sum(x.attributes.get("migProfile") == {"string": "3g.40gb"} for x in d) == 4,
        )
        held = next(
            d
            for d in published
            if d.attributes.get("uuid", {}).get("string")
            in {m.uuid for m in discover(run.nvml).gpus[3].mig_devices if m.placement.start == 0}
        )
        ref = claim(run, "infer", held.name)
        assert (await run.prepare(ref)).error == ""
        with run.daemon.pipeline.outcomes() as outcomes:
            run.write(declared("{7g.80gb: 1}"))
            await next_applied(outcomes)
        (state,) = run.daemon.status.to_json()["mig"].values()
        assert state["state"] == "pending"
        uuid = held.attributes["uuid"]["string"]
        assert state["reason"].startswith(
            f"waiting for ResourceClaim default/infer to release {uuid}"
        )
        assert calls(run) == []  # nothing touched while the claim holds its instance
        with run.daemon.pipeline.outcomes() as outcomes:
            assert await run.unprepare(ref) == ""
            while (await next_applied(outcomes)).trigger.value != "MIG layout pending":
                pass
        assert instances(run, 3) == ["7g.80gb@0"]
        (state,) = run.daemon.status.to_json()["mig"].values()
        assert state["state"] == "applied"


@pytest.mark.parametrize("config", [dynamic("[3]"), declared("{1g.10gb: 7}")])
async def test_run_dra_logs_nothing_about_not_applying_layouts(
    short_dir: Path, config: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with dra_running(short_dir, config, gpus=A100) as run:
        await wait_published(run.keeper, lambda d: len(d) > 0)
    assert not any("does not apply partitioning.mig" in r.message for r in caplog.records)


async def test_an_xid_on_a_claims_new_mig_device_is_that_devices_alone(short_dir: Path) -> None:
    """The health watch follows the instances made for claims: an Xid on one is attributed to
    it, not taken for an unknown device (which would mark every GPU unhealthy)."""
    gpus = {"product": "NVIDIA A100-SXM4-80GB", "count": 2, "mig": {"enabled": True}}
    path = node_file(short_dir, {"gpus": [gpus]})
    spec = f"simulated:{path}"
    first, second = (g.uuid for g in discover(backend_from_spec(spec)).gpus)
    watches = _Watches()
    logger = logging.getLogger("sharing_plugin.daemon.node.health_monitor")
    level = logger.level
    logger.setLevel(logging.INFO)  # the line counted is logged at INFO
    logger.addHandler(watches)
    try:
        async with dra_running(short_dir, dynamic("all"), gpus=spec) as run:
            await run.published(2 * 25)
            await watches.started(1)
            ref = claim(run, "hot", placement_name(first, "3g.40gb", 0))
            assert (await run.prepare(ref)).error == ""
            (mig,) = discover(run.nvml).gpus[0].mig_devices
            monitor = health_monitor(run.daemon.pipeline)
            assert monitor is not None and mig.uuid in monitor.health
            await watches.started(2)  # watching again, the new MIG device among the devices
            append_fault(path, {"gpu": mig.uuid, "xid": 94})
            pipeline = run.daemon.pipeline
            await wait_published(run.keeper, lambda d: pipeline.health.get(mig.uuid) is False)
            assert pipeline.health.get(first) is not False
            assert pipeline.health.get(second) is not False
            published = {d.name for d in run.keeper.pool()}
            assert placement_name(second, "7g.80gb", 0) in published  # the other GPU serves on
            assert placement_name(first, "3g.40gb", 0) in published  # held until unprepared
    finally:
        logger.removeHandler(watches)
        logger.setLevel(level)


class _Watches(logging.Handler):
    """Counts the health monitor's watch starts (its log line), for a test to wait on."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.count = 0
        self._changed = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("GPU health: watching"):
            self.count += 1
            self._changed.set()

    async def started(self, count: int) -> None:
        async with asyncio.timeout(5):
            while self.count < count:
                self._changed.clear()
                await self._changed.wait()


async def test_unprepare_succeeds_when_the_claims_gpu_left_the_node(
    short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    two = {"product": "NVIDIA A100-SXM4-80GB", "count": 2, "mig": {"enabled": True}}
    path = node_file(short_dir, {"gpus": [two]})
    gone = discover(backend_from_spec(f"simulated:{path}")).gpus[1].uuid
    async with FakeKubeApi() as api:
        async with dra_running(short_dir, dynamic("all"), gpus=f"simulated:{path}", api=api) as run:
            await run.published(2 * 25)
            ref = claim(run, "orphan", placement_name(gone, "7g.80gb", 0))
            assert (await run.prepare(ref)).error == ""
        node_file(short_dir, {"gpus": [{**two, "count": 1}]})  # GPU 1 is gone
        async with dra_running(short_dir, dynamic("all"), gpus=f"simulated:{path}", api=api) as run:
            assert await run.unprepare(ref) == ""
            assert run.daemon.preparer is not None and run.daemon.preparer.prepared == {}
    assert any("the GPU is not on this node" in r.message for r in caplog.records)
