"""`sharing-plugin run` (time-slicing) on a real one-node cluster (tests/realcluster.py): pods
placed by the real scheduler, admitted by the real kubelet's device manager, and what the
kubelet handed the container runtime for them, compared with what `plan` promises.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import realcluster
import yaml
from realcluster_state import held
from realcluster_support import CLUSTER_TEST_MARKS, GPU, STATE_LABEL, on_node, sliced, unschedulable

from sharing_plugin.backends import backend_from_spec
from sharing_plugin.config.model import Config
from sharing_plugin.nvml.discover import discover
from sharing_plugin.plan import ResourcePlan, plan

pytestmark = CLUSTER_TEST_MARKS

SHARED = "nvidia.com/gpu.shared"
T4X4 = "simulated:t4x4"
# GPUs 0-1 whole, GPUs 2-3 three ways; told to the container as env and as CDI names.
WHOLE_AND_SHARED = f"""\
version: v1
flags:
  plugin:
    deviceListStrategy: [envvar, cdi-cri]
sharing:
  timeSlicing:
    resources:
      - name: {GPU}
        rename: {SHARED}
        replicas: 3
        devices: [2, 3]
"""


def expected(config: str, gpus: str) -> dict[str, ResourcePlan]:
    """What `plan` says each resource advertises on that node."""
    node = discover(backend_from_spec(gpus))
    the_plan = plan(Config.model_validate(yaml.safe_load(config)), node)
    return {r.name: r for r in the_plan.resources}


def told(record: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The GPUs a CreateContainer names: in NVIDIA_VISIBLE_DEVICES and as CDI devices."""
    env = record["envs"]["NVIDIA_VISIBLE_DEVICES"].split(",")
    cdi = [name.removeprefix(f"{GPU}=") for name in record["cdi_devices"]]
    return sorted(env), sorted(cdi)


async def test_pods_are_placed_admitted_and_told_what_plan_promises(
    real_cluster: realcluster.RealCluster, short_dir: Path
) -> None:
    wanted = expected(WHOLE_AND_SHARED, T4X4)
    async with on_node(real_cluster, short_dir) as node:
        await node.configure(WHOLE_AND_SHARED)
        async with node.plugin(T4X4) as plugin:
            allocatable = await node.allocatable(lambda a: a.get(SHARED) == "6")
            assert allocatable[GPU] == "2", plugin.stderr()
            namespace = await node.namespace()
            await node.pod(namespace, "whole", {GPU: 2})
            for n in range(6):
                await node.pod(namespace, f"shared-{n}", {SHARED: 1})
            pods = [await node.running(namespace, "whole")]
            pods += [await node.running(namespace, f"shared-{n}") for n in range(6)]
            await node.pod(namespace, "one-too-many", {SHARED: 1})
            pending = await node.pod_when(namespace, "one-too-many", unschedulable)
            assert f"Insufficient {SHARED}" in str(unschedulable(pending)), pending
            holds = await held(node)
            by_gpu: dict[str, int] = {}
            for pod in pods:
                name = pod["metadata"]["name"]
                resource = GPU if name == "whole" else SHARED
                ids = holds[(name, resource)]
                physical = sorted({str(wanted[resource].device(i).gpu_uuid) for i in ids})  # type: ignore[union-attr]
                assert told(node.created(pod)) == (physical, physical), (name, ids)
                for uuid in physical:
                    by_gpu[uuid] = by_gpu.get(uuid, 0) + 1
            assert len(holds[("whole", GPU)]) == 2
            # Every advertised device went to one pod: each shared GPU carries three.
            shared_gpus = {str(d.gpu_uuid) for d in wanted[SHARED].devices}
            assert {u: by_gpu[u] for u in shared_gpus} == dict.fromkeys(shared_gpus, 3)
            assert await plugin.stop() == 0, plugin.stderr()


L4 = "simulated:workstation"  # one GPU


async def test_config_edits_reach_the_scheduler_and_spare_running_pods(
    real_cluster: realcluster.RealCluster, short_dir: Path
) -> None:
    four = {"four": sliced(4)}
    async with on_node(real_cluster, short_dir) as node:
        await node.configure(sliced(2), **four)
        async with node.plugin(L4) as plugin:
            await node.allocatable(lambda a: a.get(GPU) == "2")
            namespace = await node.namespace()
            for name in ("a", "b", "c"):
                await node.pod(namespace, name, {GPU: 1})
            running = [await node.running(namespace, n) for n in ("a", "b")]
            await node.pod_when(namespace, "c", unschedulable)

            # Raising replicas: the Node's allocatable, then the Pending pod runs.
            await node.configure(sliced(3), **four)
            running.append(await node.running(namespace, "c"))

            # Lowering them under three running pods: the replica one of them holds is kept
            # (advertised Unhealthy until released), the Node shows two allocatable of three,
            # and no pod is disturbed.
            await node.configure(sliced(2), **four)
            node_now = await node.node_when(
                lambda n: (
                    n["status"]["allocatable"][GPU] == "2" and n["status"]["capacity"][GPU] == "3"
                )
            )
            holds = await held(node)
            ids = sorted(i for (_, resource), got in holds.items() if resource == GPU for i in got)
            assert len(ids) == 3 and ids[-1].endswith("::2"), holds
            # A broken edit: an Event and the state label on the Node, nothing else changes.
            since = time.time() - 1.0
            await node.configure(sliced(0), **four)
            event = await node.event("ConfigRejected", since)
            assert event["type"] == "Warning" and "replicas" in event["message"], event
            node_now = await node.node_when(
                lambda n: n["metadata"]["labels"].get(STATE_LABEL) == "failed"
            )
            assert node_now["status"]["allocatable"][GPU] == "2"

            # The node label picks another named config.
            await node.pod(namespace, "d", {GPU: 1})
            await node.pod_when(namespace, "d", unschedulable)
            # (Every named config of the ConfigMap is loaded at each reload: a broken one refuses
            # a label naming another, so the admin mends it first.)
            await node.configure(sliced(2), **four)
            await node.label("four")
            await node.running(namespace, "d")
            node_now = await node.node_when(lambda n: n["status"]["capacity"][GPU] == "4")
            assert node_now["metadata"]["labels"][STATE_LABEL] == "success"
            for pod in running:  # still running, each container created once
                now = await node.running(namespace, pod["metadata"]["name"])
                assert now["metadata"]["uid"] == pod["metadata"]["uid"]
                node.created(pod)
            assert await plugin.stop() == 0, plugin.stderr()
