"""The daemon end to end in-process: config -> GPUs -> plan -> servers -> kubelet simulator."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest
from daemon_harness import eventually, node_file, run_options, running
from support.observe import (
    drop_before_stream,
    health_monitor,
    next_applied,
    resource_names,
    servers,
)

from sharing_plugin.backends import backend_from_spec
from sharing_plugin.daemon.run.app import NodeDevicePlugin
from sharing_plugin.nvml.discover import discover
from sharing_plugin.plan import plan
from sharing_plugin.sim.kubelet.simulator import KubeletSimulator
from sharing_plugin.sources.files import load_configs
from sharing_plugin.sources.update import Trigger

EXAMPLES = Path(__file__).parents[2] / "config" / "examples"
TIME_SLICING = """\
version: v1
sharing:
  timeSlicing:
    resources:
      - name: nvidia.com/gpu
        replicas: 2
"""


@pytest.mark.parametrize(
    ("example", "preset"),
    [
        ("time-slicing.yaml", "dgx-a100-80gb"),
        ("per-gpu-replicas.yaml", "dgx-h100"),
        ("mps.yaml", "dgx-h100"),
        ("reference-readme.yaml", "t4x4"),
        ("mig-mixed.yaml", "a100-mig-mixed"),
    ],
)
async def test_example_configs_are_registered_and_advertised(
    short_dir: Path, example: str, preset: str
) -> None:
    text = (EXAMPLES / example).read_text()
    async with running(short_dir, text, gpus=f"simulated:{preset}") as run:
        config = load_configs(run.config)[None].config
        expected = plan(config, discover(backend_from_spec(f"simulated:{preset}")))
        assert run.capacity() == {r.name: len(r.devices) for r in expected.resources}
        assert {r.resource for r in run.kubelet.registrations} == set(resource_names(expected))
        assert run.daemon.status.ready


async def test_a_pod_gets_the_physical_gpu_behind_its_replica(short_dir: Path) -> None:
    async with running(short_dir, TIME_SLICING) as run:
        pod = await run.kubelet.admit_pod("p", containers={"c": {"nvidia.com/gpu": 1}})
        (device_id,) = pod.device_ids("c", "nvidia.com/gpu")
        envs = pod.get("c", "nvidia.com/gpu").response.envs
        assert envs["NVIDIA_VISIBLE_DEVICES"] == device_id.split("::")[0]
        assert device_id.startswith("GPU-") and "::" in device_id


async def test_kubelet_restart_reregisters_every_resource_on_a_new_socket(
    short_dir: Path,
) -> None:
    async with running(short_dir, TIME_SLICING) as run:
        before = {s.name: s.socket_path for s in servers(run.daemon.supervisor).values()}
        await run.kubelet.restart()
        await run.settled()
        after = {s.name: s.socket_path for s in servers(run.daemon.supervisor).values()}
        assert before.keys() == after.keys()
        assert all(before[n] != after[n] and after[n] is not None for n in before)
        assert all(p is not None and p.exists() for p in after.values())
        assert run.capacity() == {"nvidia.com/gpu": 16}


async def test_kubelet_restart_registers_each_resource_once(
    short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The restarted kubelet ends our streams and creates its socket: two signals of one
    restart. Each resource registers with the new kubelet once; the second signal finds it
    registered there and leaves its endpoint alone (a second registration would make kubelet
    swap the endpoint it just dialled, and leave our old socket closing after we settled)."""
    caplog.set_level(logging.INFO, logger="sharing_plugin")
    async with running(short_dir, TIME_SLICING) as run:
        await run.kubelet.restart()
        await run.settled()
        after = {s.name: s.socket_path for s in servers(run.daemon.supervisor).values()}
        # Both signals handled: the watch has seen kubelet.sock created, and a registration it
        # would start (milliseconds against the simulator) has had time to reach kubelet.
        await eventually(
            lambda: any("kubelet socket (re)created" in r.getMessage() for r in caplog.records)
        )
        await asyncio.sleep(0.2)
        await run.settled()
        assert sorted((r.resource, r.endpoint) for r in run.kubelet.registrations) == sorted(
            (name, path.name) for name, path in after.items() if path is not None
        )
        assert {s.name: s.socket_path for s in servers(run.daemon.supervisor).values()} == after


async def test_a_registration_kubelet_drops_before_its_stream_opens_is_registered_again(
    short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Our socket is deleted while kubelet lives, and kubelet drops the registration made on
    the new socket before its stream reaches us (the 1.32 kubelet does, when a superseded
    stream of the resource ends in that moment): nothing of ours ends, so only the stream that
    never came tells, and run registers again."""
    caplog.set_level(logging.INFO, logger="sharing_plugin")
    async with running(short_dir, TIME_SLICING) as run:
        (gpu,) = servers(run.daemon.supervisor).values()
        old = gpu.socket_path
        assert old is not None and len(run.kubelet.registrations) == 1
        drop_before_stream(run.kubelet, gpu.name)
        old.unlink()
        await run.kubelet.wait_for(lambda: run.kubelet.allocatable(gpu.name) == 0)
        await run.kubelet.wait_for(lambda: len(run.kubelet.registrations) == 3, timeout=5)
        await run.settled()
        assert run.allocatable() == {gpu.name: 16}
        new = gpu.socket_path
        assert new is not None and new != old
        assert [r.endpoint for r in run.kubelet.registrations[1:]] == [new.name, new.name]
        dropped = [
            r.getMessage() for r in caplog.records if "dropped the registration" in r.getMessage()
        ]
        assert dropped == [
            f"kubelet dropped the registration of {gpu.name} on {new.name}: it opened no "
            "ListAndWatch stream within 1 s of Register"
        ]
        await eventually(lambda: run.daemon.status.ready and gpu.registered)


async def test_plugin_started_before_kubelet_registers_once_kubelet_appears(
    short_dir: Path,
) -> None:
    config = short_dir / "config.yaml"
    config.write_text(TIME_SLICING)
    options = run_options(config_path=config, gpus="simulated:t4x4", kubelet_dir=short_dir)
    async with NodeDevicePlugin(options, nvml=backend_from_spec(options.source.gpus)) as daemon:
        assert not daemon.status.ready
        async with KubeletSimulator(short_dir, grace_period=0.2) as kubelet:
            await kubelet.wait_for(lambda: kubelet.capacity("nvidia.com/gpu") == 8, timeout=10)
            await eventually(lambda: daemon.status.ready)


async def test_close_removes_every_socket_and_kubelet_sees_nothing(short_dir: Path) -> None:
    async with running(short_dir, TIME_SLICING) as run:
        sockets = run.daemon.supervisor.own_sockets()
        assert sockets and all(p.exists() for p in sockets)
        await run.daemon.close()
        await run.kubelet.wait_for(lambda: run.kubelet.capacity("nvidia.com/gpu") == 0)
        assert not any(p.exists() for p in sockets)


async def test_invalid_config_at_start_serves_nothing_until_fixed(short_dir: Path) -> None:
    broken = TIME_SLICING.replace("replicas: 2", "replica: 2")
    async with running(short_dir, broken, wait_ready=False) as run:
        assert not run.daemon.status.ready
        error = run.daemon.status.last_error
        assert error is not None and "config.yaml:6:9" in error and "replica" in error
        assert run.kubelet.resources() == []
        run.write(TIME_SLICING)
        await run.settled()
        assert run.capacity() == {"nvidia.com/gpu": 16}
        assert run.daemon.status.last_error is None


async def test_status_json_reports_config_and_resources(short_dir: Path) -> None:
    async with running(short_dir, TIME_SLICING) as run:
        status = json.loads(json.dumps(run.daemon.status.to_json()))
        assert status["config"]["generation"] == 1
        assert status["config"]["hash"]
        assert status["lastError"] is None
        assert status["resources"]["nvidia.com/gpu"]["devices"] == 16
        assert status["resources"]["nvidia.com/gpu"]["healthy"] == 16
        assert status["resources"]["nvidia.com/gpu"]["draining"] == []


async def test_gpus_that_appear_later_are_served_without_failon_init_error(
    short_dir: Path,
) -> None:
    """A node whose driver is still loading at start: with failOnInitError false the plugin
    starts empty, keeps looking, and serves the GPUs once NVML answers."""
    node = node_file(short_dir, {"gpus": [{"product": "Tesla T4", "count": 4}]})
    node.write_text(node.read_text() + "driverLoaded: false\n")
    gpus = f"simulated:{node}"
    config = short_dir / "config.yaml"
    config.write_text(TIME_SLICING + "flags:\n  failOnInitError: false\n")
    options = run_options(config_path=config, gpus=gpus, kubelet_dir=short_dir, rediscover_s=0.05)
    async with (
        KubeletSimulator(short_dir, grace_period=0.2) as kubelet,
        NodeDevicePlugin(options, nvml=backend_from_spec(gpus)) as daemon,
    ):
        assert daemon.supervisor.advertised is not None
        assert daemon.supervisor.advertised.resources == ()
        with daemon.pipeline.outcomes() as outcomes:
            node.write_text(node.read_text().replace("driverLoaded: false", "driverLoaded: true"))
            found = await next_applied(outcomes)
        assert found.trigger is Trigger.GPUS_FOUND and len(found.inventory.gpus) == 4
        await kubelet.wait_for(lambda: kubelet.allocatable("nvidia.com/gpu") == 8, timeout=5)
        status = daemon.status.to_json()
        assert status["config"]["generation"] == 1 and status["lastError"] is None
        await eventually(lambda: health_monitor(daemon.pipeline) is not None)  # GPUs to watch now
