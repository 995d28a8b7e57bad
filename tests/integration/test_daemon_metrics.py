"""What a running daemon's /metrics says about itself: version, config in use, devices in use."""

from __future__ import annotations

from pathlib import Path

from daemon_harness import eventually, running
from prometheus_client.parser import text_string_to_metric_families

from sharing_plugin import installed_version
from sharing_plugin.daemon.run.app import NodeDevicePlugin

TIME_SLICING = """\
version: v1
sharing:
  timeSlicing:
    resources:
      - name: nvidia.com/gpu
        replicas: 2
"""
GPU = "nvidia.com/gpu"


def series(daemon: NodeDevicePlugin, name: str) -> dict[frozenset[tuple[str, str]], float]:
    text = daemon.metrics.render().decode()
    return {
        frozenset(s.labels.items()): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


async def test_build_info_carries_the_installed_version(short_dir: Path) -> None:
    async with running(short_dir, TIME_SLICING) as run:
        info = series(run.daemon, "sharing_plugin_build_info")
        assert info == {frozenset({("version", installed_version())}): 1}
        assert installed_version() != "unknown"


async def test_config_info_names_the_config_in_use_and_follows_reloads(short_dir: Path) -> None:
    async with running(short_dir, TIME_SLICING) as run:
        status = run.daemon.status.config
        assert status is not None
        (labels,) = series(run.daemon, "sharing_plugin_config_info")
        assert dict(labels) == {"name": "", "hash": status.hash, "generation": "1"}

        run.write(TIME_SLICING.replace("replicas: 2", "replicas: 3"))
        await eventually(
            lambda: any(
                ("generation", "2") in labels
                for labels in series(run.daemon, "sharing_plugin_config_info")
            )
        )
        (labels,) = series(run.daemon, "sharing_plugin_config_info")  # one series at a time
        assert (now := run.daemon.status.config) is not None and dict(labels)["hash"] == now.hash
        assert dict(labels)["hash"] != status.hash


async def test_allocated_available_and_replicas_in_use_follow_pods(short_dir: Path) -> None:
    async with running(short_dir, TIME_SLICING) as run:  # 8 GPUs x 2 replicas
        assert series(run.daemon, "sharing_plugin_devices_allocated") == {
            frozenset({("resource", GPU)}): 0
        }
        pod = await run.kubelet.admit_pod("p", containers={"c": {GPU: 1}})
        (device_id,) = pod.device_ids("c", GPU)
        gpu = device_id.split("::")[0]
        # the supervisor applies again (a reload); the PodResources answer it reads has the pod
        run.write(TIME_SLICING + "# touched\n")

        def counted() -> bool:
            return series(run.daemon, "sharing_plugin_devices_allocated") == {
                frozenset({("resource", GPU)}): 1
            }

        await eventually(counted)
        assert series(run.daemon, "sharing_plugin_devices_available") == {
            frozenset({("resource", GPU)}): 15
        }
        in_use = series(run.daemon, "sharing_plugin_gpu_replicas_in_use")
        assert in_use[frozenset({("gpu", gpu)})] == 1
        assert len(in_use) == 8 and sum(in_use.values()) == 1
