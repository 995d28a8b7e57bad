"""`sharing-plugin run-dra` on a real one-node cluster (tests/realcluster.py): deploy/dra's
DeviceClasses and RBAC, claims allocated by the real scheduler's DRA plugin and prepared by the
real kubelet's DRA manager.
"""

from __future__ import annotations

import time
from pathlib import Path

import realcluster
from lightkube.resources.core_v1 import Pod
from realcluster_state import slices_when
from realcluster_support import CLUSTER_TEST_MARKS, DEPLOY_DRA, DRIVER, on_node, sliced

pytestmark = CLUSTER_TEST_MARKS

T4X4 = "simulated:t4x4"
TRIES = 5
# A pod placed where its prepare fails waits for the kubelet's resync (60-90 s); one placed
# where the kubelet can prepare runs in about a second.
RUNS_WITHIN_S = 10.0


async def test_a_pod_placed_the_moment_the_slices_appear_runs(
    real_cluster: realcluster.RealCluster, short_dir: Path
) -> None:
    async with on_node(real_cluster, short_dir, DEPLOY_DRA) as node:
        await node.configure(sliced(2))
        namespace = await node.namespace()
        await node.claim_template(namespace, "one-gpu", f"gpu.{DRIVER}")
        took = []
        for attempt in range(TRIES):
            name = f"p{attempt}"
            async with node.plugin(T4X4, command="run-dra", CLEAR_SLICES_ON_EXIT="on") as plugin:
                await slices_when(node, bool)
                start = time.monotonic()
                await node.pod(namespace, name, {}, template="one-gpu")
                try:
                    await node.running(namespace, name, within=RUNS_WITHIN_S)
                except TimeoutError:
                    said = node.cluster.kubectl("get", "events", "-n", namespace)
                    raise AssertionError(f"try {attempt} (before: {took}): {said}") from None
                took.append(time.monotonic() - start)
                await node.client.delete(Pod, name, namespace=namespace)
                assert await plugin.stop(timeout=10) == 0, plugin.stderr()
            await slices_when(node, lambda s: not s)
        assert max(took) < RUNS_WITHIN_S, took
