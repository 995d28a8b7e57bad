"""`sharing-plugin run` serving MIG devices (mixed strategy, with a declared layout) and MPS
(`mps-control` beside it, with the stand-in control binary) on a real one-node cluster
(tests/realcluster.py): what the real kubelet hands the runtime for pods the real scheduler
placed, compared with the answer `plan` computes for the devices the kubelet gave them.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import realcluster
import yaml
from realcluster_state import held
from realcluster_support import CLUSTER_TEST_MARKS, GPU, OnNode, on_node
from support.mps import alive, pid_of, write_wrapper

from sharing_plugin.backends import backend_from_spec
from sharing_plugin.config.model import Config
from sharing_plugin.nvml.discover import discover
from sharing_plugin.plan.allocate import allocate
from sharing_plugin.plan.model import ContainerAllocation, Plan
from sharing_plugin.plan.node import plan_node

pytestmark = CLUSTER_TEST_MARKS

MIG_NODE = "simulated:a100-mig-mixed"
# GPU 3 has MIG on and no instance: the plugin creates two 3g.40gb there before advertising.
MIXED_WITH_LAYOUT = """\
version: v1
flags:
  migStrategy: mixed
partitioning:
  mig:
    - devices: [3]
      profiles: {3g.40gb: 2}
"""
MIG_3G = "nvidia.com/mig-3g.40gb"
MIG_1G = "nvidia.com/mig-1g.10gb"


def planned(config: str, gpus: str, *, as_is: bool) -> tuple[Config, Plan]:
    """The config, and `plan`'s answer for it on that node (as the node is now, or as the
    declared layouts will leave it)."""
    parsed = Config.model_validate(yaml.safe_load(config))
    return parsed, plan_node(parsed, discover(backend_from_spec(gpus)), as_is=as_is).plan


def promised(config: Config, the_plan: Plan, resource: str, ids: list[str]) -> ContainerAllocation:
    (found,) = [r for r in the_plan.resources if r.name == resource]
    return allocate(found, ids, config.flags)


def assert_told(record: dict[str, Any], allocation: ContainerAllocation) -> None:
    """The runtime was handed the allocation's env, mounts and device nodes."""
    for key, value in allocation.envs.items():
        assert record["envs"].get(key) == value, (key, record["envs"])
    mounts = {(m["container_path"], m["host_path"]) for m in record["mounts"]}
    assert {(m.container_path, m.host_path) for m in allocation.mounts} <= mounts, mounts
    devices = {(d["container_path"], d["host_path"]) for d in record["devices"]}
    assert {(d.container_path, d.host_path) for d in allocation.devices} <= devices, devices


async def run_pods(node: OnNode, asks: dict[str, dict[str, int]]) -> tuple[str, dict[str, Any]]:
    namespace = await node.namespace()
    for name, limits in asks.items():
        await node.pod(namespace, name, limits)
    return namespace, {name: await node.running(namespace, name) for name in asks}


async def test_mig_mixed_strategy_and_a_declared_layout_reach_the_containers(
    real_cluster: realcluster.RealCluster, short_dir: Path
) -> None:
    config, now = planned(MIXED_WITH_LAYOUT, MIG_NODE, as_is=True)
    _, to_be = planned(MIXED_WITH_LAYOUT, MIG_NODE, as_is=False)
    counts = {r.name: str(len(r.devices)) for r in to_be.resources}
    assert counts[MIG_3G] == "4"  # two of them the layout's
    async with on_node(real_cluster, short_dir) as node:
        await node.configure(MIXED_WITH_LAYOUT)
        async with node.plugin(MIG_NODE) as plugin:
            allocatable = await node.allocatable(lambda a: a.get(MIG_3G) == "4")
            mine = {k: v for k, v in allocatable.items() if k.startswith("nvidia.com/")}
            assert mine == counts, plugin.stderr()
            asks = {"big": {MIG_3G: 4}, "small": {MIG_1G: 1}, "whole": {GPU: 1}}
            _, pods = await run_pods(node, asks)
            holds = await held(node)
            for name in ("small", "whole"):  # devices that existed before: plan's answer
                ((resource, _),) = asks[name].items()
                ids = holds[(name, resource)]
                assert_told(node.created(pods[name]), promised(config, now, resource, ids))
            # The four 3g.40gb, two of them created by the plugin, named by their MIG UUIDs.
            ids = holds[("big", MIG_3G)]
            told = node.created(pods["big"])["envs"]["NVIDIA_VISIBLE_DEVICES"].split(",")
            assert sorted(told) == sorted(ids) and all(i.startswith("MIG-") for i in ids)
            existing = {d.physical for r in now.resources for d in r.devices}
            assert len(set(ids) - existing) == 2, (ids, existing)
            assert await plugin.stop() == 0, plugin.stderr()


@pytest.fixture
def control_binary(short_dir: Path) -> Iterator[Path]:
    """The stand-in `nvidia-cuda-mps-control`; the daemons it started killed afterwards."""
    yield write_wrapper(short_dir / "bin")
    for pid_file in short_dir.rglob("nvidia-cuda-mps-control.pid"):
        pid = pid_of(pid_file.parent)
        if pid is not None and alive(pid):
            os.kill(pid, signal.SIGKILL)


async def test_mps_pods_get_the_pipe_env_and_mounts(
    real_cluster: realcluster.RealCluster, short_dir: Path, control_binary: Path
) -> None:
    mps = (
        f"version: v1\nflags:\n  mpsRoot: {short_dir / 'mps'}\n"
        f"sharing:\n  mps:\n    resources:\n      - name: {GPU}\n        replicas: 2\n"
    )
    gpus = "simulated:t4x4"
    config, the_plan = planned(mps, gpus, as_is=True)
    async with on_node(real_cluster, short_dir) as node:
        await node.configure(mps)
        control = node.plugin(gpus, command="mps-control", MPS_CONTROL_BIN=str(control_binary))
        async with node.plugin(gpus) as plugin, control:
            # Advertised Healthy only once the daemons serve.
            await node.allocatable(lambda a: a.get(GPU) == "8", within=60)
            _, pods = await run_pods(node, {"a": {GPU: 1}, "b": {GPU: 1}})
            holds = await held(node)
            for name, pod in pods.items():
                allocation = promised(config, the_plan, GPU, holds[(name, GPU)])
                assert "CUDA_MPS_PIPE_DIRECTORY" in allocation.envs
                assert any(m.container_path == "/dev/shm" for m in allocation.mounts)
                assert_told(node.created(pod), allocation)
            assert await control.stop() == 0, control.stderr()
            assert await plugin.stop() == 0, plugin.stderr()
