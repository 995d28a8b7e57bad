"""A rolling update of `run` with `maxSurge: 1, maxUnavailable: 0` on a real one-node cluster
(tests/realcluster.py, Kubernetes 1.36): the new process registers while the old one serves,
then the old one stops; pods created during the handover run, and the Node keeps its count.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import realcluster
from realcluster_support import CLUSTER_TEST_MARKS, GPU, on_node, sliced

pytestmark = CLUSTER_TEST_MARKS

T4X4 = "simulated:t4x4"  # four GPUs: eight replicas at two each


async def test_pods_created_during_a_rolling_update_run(
    real_cluster: realcluster.RealCluster, short_dir: Path
) -> None:
    async with on_node(real_cluster, short_dir) as node:
        await node.configure(sliced(2))
        namespace = await node.namespace()
        async with node.plugin(T4X4) as old:
            await node.allocatable(lambda a: a.get(GPU) == "8")
            await node.pod(namespace, "before", {GPU: 1})
            await node.running(namespace, "before")
            async with node.plugin(T4X4) as new:
                await new.wait_for_line("registered nvidia.com/gpu with kubelet", timeout=20)
                stopping = asyncio.ensure_future(old.stop())
                await node.pod(namespace, "during", {GPU: 1})
                assert await stopping == 0, old.stderr()
                await node.pod(namespace, "after", {GPU: 1})
                for name in ("during", "after"):
                    await node.running(namespace, name)
                assert "no empty list sent" in old.stderr()
                assert "kubelet dropped the registration" not in new.stderr()
                # The kubelet's next status update still counts every replica.
                await asyncio.sleep(11)
                await node.allocatable(lambda a: a.get(GPU) == "8")
                assert await new.stop() == 0, new.stderr()
