"""`sharing-plugin run` on a real one-node cluster (tests/realcluster.py) through restarts with
pods running: the plugin killed and started again, then the whole node restarted (the kubelet
back from its checkpoint). The kubelet's records are what a restart must agree with.
"""

from __future__ import annotations

import signal
from pathlib import Path

import realcluster
from realcluster_state import held, restarted
from realcluster_support import CLUSTER_TEST_MARKS, GPU, OnNode, on_node, sliced, unschedulable

pytestmark = CLUSTER_TEST_MARKS

T4X4 = "simulated:t4x4"  # four GPUs: eight replicas at two each


def none_allocatable(allocatable: dict[str, str]) -> bool:
    return allocatable.get(GPU, "0") == "0"


async def uids(node: OnNode, namespace: str, names: list[str]) -> dict[str, str]:
    return {n: (await node.running(namespace, n))["metadata"]["uid"] for n in names}


async def test_killed_plugin_and_restarted_node_keep_pods_and_grant_nothing_twice(
    real_cluster: realcluster.RealCluster, short_dir: Path
) -> None:
    first = ["a", "b", "c"]
    async with on_node(real_cluster, short_dir) as node:
        await node.configure(sliced(2))
        async with node.plugin(T4X4) as plugin:
            await node.allocatable(lambda a: a.get(GPU) == "8")
            namespace = await node.namespace()
            for name in first:
                await node.pod(namespace, name, {GPU: 1})
            running = await uids(node, namespace, first)
            before = await held(node)
            assert sorted(before) == [(n, GPU) for n in first], before
            assert await plugin.stop(signal.SIGKILL) == -signal.SIGKILL

        # A new process registers the same resource: same device IDs, nothing disturbed.
        async with node.plugin(T4X4) as plugin:
            await plugin.wait_for_line("registered nvidia.com/gpu with kubelet", timeout=20)
            await node.allocatable(lambda a: a.get(GPU) == "8")
            assert await held(node) == before
            assert await plugin.stop(signal.SIGKILL) == -signal.SIGKILL
        # The kubelet marks the devices of a plugin gone Unhealthy: the Node shows none, so
        # the count that comes back below is the restarted kubelet's.
        await node.allocatable(none_allocatable)

        await restarted(node)
        async with node.plugin(T4X4) as plugin:
            await node.allocatable(lambda a: a.get(GPU) == "8", within=60)
            assert await uids(node, namespace, first) == running
            assert await held(node) == before
            # The five devices left go to five new pods, each to one; a sixth waits.
            more = [f"new-{n}" for n in range(5)]
            for name in more:
                await node.pod(namespace, name, {GPU: 1})
            await uids(node, namespace, more)
            await node.pod(namespace, "one-too-many", {GPU: 1})
            pending = await node.pod_when(namespace, "one-too-many", unschedulable)
            assert f"Insufficient {GPU}" in str(unschedulable(pending)), pending
            holds = await held(node)
            ids = [i for (_, resource), got in holds.items() if resource == GPU for i in got]
            assert len(ids) == 8 and len(set(ids)) == 8, holds
            for name in first:  # each container created once: the restart re-created none
                node.created(await node.running(namespace, name))
            assert await plugin.stop() == 0, plugin.stderr()
