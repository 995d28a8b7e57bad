"""`sharing-plugin run` on a real one-node cluster (tests/realcluster.py): an Xid on the
simulated node reaches the Node's allocatable through the real kubelet's device manager, and
recovery gives it back, without disturbing the pod running on the failed GPU.
"""

from __future__ import annotations

import time
from pathlib import Path

import realcluster
from realcluster_state import append_fault, held, node_file
from realcluster_support import CLUSTER_TEST_MARKS, GPU, on_node, sliced

pytestmark = CLUSTER_TEST_MARKS

# Longer than the kubelet's node-status period (10 s): the Node shows the outage before it ends.
QUIET_S = 15
HEALTH = f"health:\n  recoveryQuietPeriodSeconds: {QUIET_S}\n  recoveryCheckSeconds: 1\n"


async def test_an_xid_drops_the_gpus_replicas_from_the_node_until_it_recovers(
    real_cluster: realcluster.RealCluster, short_dir: Path
) -> None:
    gpus = node_file(short_dir, "t4x4")
    async with on_node(real_cluster, short_dir) as node:
        await node.configure(sliced(2) + HEALTH)
        async with node.plugin(f"simulated:{gpus}") as plugin:
            await node.allocatable(lambda a: a.get(GPU) == "8")
            namespace = await node.namespace()
            await node.pod(namespace, "a", {GPU: 1})
            pod = await node.running(namespace, "a")
            (device,) = (await held(node))[("a", GPU)]
            gpu = device.split("::")[0]

            append_fault(gpus, {"gpu": gpu, "xid": 79})
            failed = time.monotonic()
            await node.allocatable(lambda a: a.get(GPU) == "6")
            await node.allocatable(lambda a: a.get(GPU) == "8", within=QUIET_S + 30)
            assert time.monotonic() - failed >= QUIET_S, plugin.stderr()
            now = await node.running(namespace, "a")
            assert now["metadata"]["uid"] == pod["metadata"]["uid"]
            node.created(now)
            assert await plugin.stop() == 0, plugin.stderr()
