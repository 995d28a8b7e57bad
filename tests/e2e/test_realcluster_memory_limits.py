"""Enforced shares on a real one-node cluster: a pod asking capped replicas is placed by the real
scheduler, admitted by the real kubelet, and its CreateContainer carries the memory limit env
vars and the CDI device of its GPU, which the spec `run` wrote in `--cdi-dir` resolves."""

from __future__ import annotations

import json
from pathlib import Path

import realcluster
import yaml
from realcluster_support import CLUSTER_TEST_MARKS, GPU, on_node
from support.cdi_schema import cdi_problems

pytestmark = CLUSTER_TEST_MARKS

T4_MIB = 15_360


def capped(hook: Path) -> str:
    return (
        f"version: v1\nmemoryLimits:\n  enforce: required\n  hookPath: {hook}\n"
        f"sharing:\n  timeSlicing:\n    resources:\n      - name: {GPU}\n        replicas: 4\n"
    )


async def test_a_capped_replica_reaches_the_runtime_with_its_limit_and_cdi_device(
    real_cluster: realcluster.RealCluster, short_dir: Path
) -> None:
    hook = short_dir / "nvidia-cdi-hook"
    hook.write_text("#!/bin/sh\nexit 0\n")
    hook.chmod(0o755)
    node_file = short_dir / "node.yaml"
    description = {"gpus": [{"product": "Tesla T4"}], "driverVersion": "615.25.01"}
    node_file.write_text(yaml.safe_dump(description))
    cdi = short_dir / "cdi"
    async with on_node(real_cluster, short_dir) as node:
        await node.configure(capped(hook))
        async with node.plugin(f"simulated:{node_file}", CDI_DIR=str(cdi)) as plugin:
            await node.allocatable(lambda a: a.get(GPU) == "4")
            namespace = await node.namespace()
            await node.pod(namespace, "two", {GPU: 2})
            record = node.created(await node.running(namespace, "two"))
            spec = json.loads((cdi / "sharing-plugin.io-memory-limit.json").read_text())
            assert cdi_problems(spec) == []
            (device,) = spec["devices"]
            uuid = device["name"]
            assert record["envs"]["NVIDIA_GPU_MEMORY_LIMIT"] == str(2 * T4_MIB // 4)
            assert record["envs"]["NVIDIA_GPU_MEMORY_REQUEST"] == str(2 * T4_MIB // 4)
            assert f"sharing-plugin.io/memory-limit={uuid}" in record["cdi_devices"]
            assert record["envs"]["NVIDIA_VISIBLE_DEVICES"] == uuid
            assert await plugin.stop() == 0, plugin.stderr()
