"""A node moved from `run` to `run-dra` on a real one-node cluster (tests/realcluster.py), step
by step as docs/contract.md ("Moving a node from run to run-dra") writes it, with a pod written
for the device plugin (`limits: {nvidia.com/gpu: 1}`) waiting throughout and served by DRA at
the end, through the scheduler's extended-resource claim.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import realcluster
from plugin_process import PluginProcess
from realcluster_state import slices_when
from realcluster_support import (
    CLUSTER_TEST_MARKS,
    DEPLOY_DRA,
    GPU,
    OnNode,
    on_node,
    sliced,
    unschedulable,
)

pytestmark = CLUSTER_TEST_MARKS

L4 = "simulated:workstation"  # one GPU
DRA_LABEL = "gpu.sharing-plugin.io/dra"
# The refusal lasts until the kubelet's next node-status update (every 10 s) shows zero.
REFUSED_AT_MOST_S = 40.0


async def started_when_allowed(dra: OnNode, tries: contextlib.AsyncExitStack) -> PluginProcess:
    """`run-dra` started again, as its pod is restarted, while it refuses to serve a node whose
    allocatable still lists the device plugin's names; the one that published its pool."""
    assert not await slices_when(dra, lambda _: True), "a pool before run-dra started"
    async with asyncio.timeout(REFUSED_AT_MOST_S):
        while True:
            plugin = await tries.enter_async_context(dra.plugin(L4, command="run-dra"))
            with_slices = asyncio.ensure_future(slices_when(dra, bool))
            ended = asyncio.ensure_future(plugin.process.wait())
            await asyncio.wait({with_slices, ended}, return_when=asyncio.FIRST_COMPLETED)
            if with_slices.done() and not ended.done():  # its pool, not a stale one
                ended.cancel()
                return plugin
            with_slices.cancel()
            await ended
            assert "allocatable from a device plugin" in plugin.stderr(), plugin.stderr()
            await asyncio.sleep(1.0)


async def test_a_node_moves_from_run_to_run_dra_as_the_contract_writes(
    real_cluster: realcluster.RealCluster, short_dir: Path
) -> None:
    (short_dir / "dp").mkdir()
    (short_dir / "dra").mkdir()
    name = real_cluster.node
    async with on_node(real_cluster, short_dir / "dp") as node:
        await node.configure(sliced(2))
        namespace = await node.namespace()
        async with node.plugin(L4) as device_plugin:
            await node.allocatable(lambda a: a.get(GPU) == "2")
            await node.pod(namespace, "before", {GPU: 1})
            await node.running(namespace, "before")
            # 1. deploy/dra applied (its RBAC and DeviceClasses): nothing changes yet.
            async with on_node(real_cluster, short_dir / "dra", DEPLOY_DRA) as dra:
                await dra.configure(sliced(2))
                await node.pod(namespace, "meanwhile", {GPU: 1})
                await node.running(namespace, "meanwhile")
                try:
                    # 2. cordon; 3. drain: the GPUs free. A pod written for the device plugin
                    # waits throughout.
                    real_cluster.kubectl("cordon", name)
                    await node.pod(namespace, "waiting", {GPU: 1})
                    await node.pod_when(namespace, "waiting", unschedulable)
                    real_cluster.kubectl(
                        "drain", name, "--ignore-daemonsets", "--force", "--timeout=60s"
                    )
                    # 4. the label: the device plugin's DaemonSet leaves (SIGTERM), deploy/dra's
                    # starts run-dra, restarted (as its pod would be) while it refuses.
                    real_cluster.kubectl("label", "node", name, f"{DRA_LABEL}=true")
                    assert await device_plugin.stop() == 0, device_plugin.stderr()
                    async with contextlib.AsyncExitStack() as tries:
                        plugin = await started_when_allowed(dra, tries)
                        # 5. the pool listed; 6. uncordon: the waiting pod runs, served by DRA.
                        real_cluster.kubectl("uncordon", name)
                        try:
                            pod = await dra.running(namespace, "waiting")
                        except TimeoutError:
                            said = real_cluster.kubectl(
                                "describe", "pod", "waiting", "-n", namespace, check=False
                            )
                            slices = real_cluster.kubectl(
                                "get", "resourceslices,node", "-o", "wide", check=False
                            )
                            logged = "\n".join(
                                line
                                for line in real_cluster.log.read_text().splitlines()
                                if "waiting" in line and namespace in line
                            )
                            raise AssertionError(
                                f"{said}\n{slices}\n{plugin.stderr()}\n{logged[-20000:]}"
                            ) from None
                        extended = pod["status"].get("extendedResourceClaimStatus")
                        assert extended is not None, pod["status"]
                        await node.pod(namespace, "after", {GPU: 1})
                        await node.running(namespace, "after")
                        assert await plugin.stop() == 0, plugin.stderr()
                finally:
                    real_cluster.kubectl("uncordon", name)
                    real_cluster.kubectl("label", "node", name, f"{DRA_LABEL}-")
