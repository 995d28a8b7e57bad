"""`sharing-plugin run-dra` on a real one-node cluster (tests/realcluster.py) with deploy/dra's
DeviceClasses: claims from templates sharing a GPU by memory, pods written for the device plugin
served through the scheduler's extended-resource claim, a dynamic MIG claim; what the kubelet
hands the runtime agrees with the CDI spec the plugin wrote for each claim; a replicas edit
that waits for the claims placed at the old share, told on the Node; claims released when their
pods go, and the edit's full effect told too.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import realcluster
import yaml
from lightkube.resources.core_v1 import Event, Pod
from realapi_support import observed
from realcluster_state import slices_when
from realcluster_support import (
    CLUSTER_TEST_MARKS,
    DEPLOY_DRA,
    DRIVER,
    GPU,
    OnNode,
    on_node,
    unschedulable,
)

from sharing_plugin.dra.resources import resource_class

pytestmark = CLUSTER_TEST_MARKS

CLAIM = resource_class("resource.k8s.io/v1", "ResourceClaim")
# Two 80 GB A100s time-sliced four ways (20 GiB a share), one partitioned per claim.
NODE = {
    "name": "dra-claims",
    "gpus": [
        {"product": "NVIDIA A100-SXM4-80GB", "count": 2},
        {"product": "NVIDIA A100-SXM4-80GB", "mig": {"enabled": True}},
    ],
}
CONFIG = f"""\
version: v1
sharing:
  timeSlicing:
    resources:
      - name: {GPU}
        replicas: 4
        devices: [0, 1]
partitioning:
  mig:
    - devices: [2]
      dynamic: true
"""
GPU_CLASS = f"gpu.{DRIVER}"
MIG_CLASS = f"mig-1g.10gb.{DRIVER}"
ON_GPU0 = [{"cel": {"expression": f'device.attributes["{DRIVER}"].index == 0'}}]


def claims_of(pod: dict[str, Any]) -> list[str]:
    """The ResourceClaims a pod uses: its own (from templates) and the scheduler's for its
    extended resources."""
    status = pod["status"]
    names = [s["resourceClaimName"] for s in status.get("resourceClaimStatuses") or ()]
    extended = status.get("extendedResourceClaimStatus")
    return names + ([extended["resourceClaimName"]] if extended else [])


async def claim(node: OnNode, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = (await node.client.get(CLAIM, name, namespace=namespace)).to_dict()
    return found


def cdi_ids(spec_dir: Path, claim_uid: str) -> set[str]:
    """The CDI IDs the claim's spec file (in the plugin's CDI dir) defines."""
    spec = json.loads((spec_dir / f"{DRIVER}-claim_{claim_uid}.json").read_text())
    return {f"{spec['kind']}={d['name']}" for d in spec["devices"]}


async def test_claims_share_serve_device_plugin_pods_partition_mig_and_are_released(
    real_cluster: realcluster.RealCluster, short_dir: Path
) -> None:
    gpus = short_dir / "gpus.yaml"
    gpus.write_text(yaml.safe_dump(NODE))
    cdi = short_dir / "cdi"
    async with on_node(real_cluster, short_dir, DEPLOY_DRA) as node:
        await node.configure(CONFIG)
        namespace = await node.namespace()
        memory = {"requests": {"memory": "30Gi"}}  # two shares of a GPU's four
        await node.claim_template(
            namespace, "30g-on-gpu0", GPU_CLASS, selectors=ON_GPU0, capacity=memory
        )
        await node.claim_template(namespace, "mig-1g", MIG_CLASS)
        async with node.plugin(f"simulated:{gpus}", command="run-dra") as plugin:
            await slices_when(node, bool)
            asks: dict[str, tuple[dict[str, int], str | None]] = {
                "mem-a": ({}, "30g-on-gpu0"),
                "mem-b": ({}, "30g-on-gpu0"),
                "plain": ({GPU: 1}, None),  # written for the device plugin
                "mig": ({}, "mig-1g"),
            }
            pods: dict[str, dict[str, Any]] = {}
            try:  # GPU 0 full first: the pods asking a default share go elsewhere
                for name, (limits, template) in asks.items():
                    await node.pod(namespace, name, limits, template=template)
                    if name == "mem-b":
                        pods |= {n: await node.running(namespace, n) for n in ("mem-a", "mem-b")}
                pods |= {name: await node.running(namespace, name) for name in asks}
            except TimeoutError:
                said = node.cluster.kubectl("get", "events,pods,resourceclaims", "-n", namespace)
                raise AssertionError(f"{said}\n{plugin.stderr()[-3000:]}") from None
            # A third 30 GiB on GPU 0 would need 90 of its 80 GB.
            await node.pod(namespace, "mem-c", {}, template="30g-on-gpu0")
            refused = await node.pod_when(namespace, "mem-c", unschedulable)
            assert "cannot allocate" in str(unschedulable(refused)), refused

            results: dict[str, dict[str, Any]] = {}
            for name, pod in pods.items():
                (claim_name,) = claims_of(pod)
                found = await claim(node, namespace, claim_name)
                (results[name],) = found["status"]["allocation"]["devices"]["results"]
                told = set(node.created(pod)["cdi_devices"])
                # The runtime is told exactly the devices the claim's CDI spec defines.
                assert told == cdi_ids(cdi, found["metadata"]["uid"]), (name, told)
            shared = [results[n] for n in ("mem-a", "mem-b")]
            assert shared[0]["device"] == shared[1]["device"]
            assert [r["consumedCapacity"] for r in shared] == [{"memory": "40Gi"}] * 2, shared
            plain_claim = claims_of(pods["plain"])[0]
            assert "extended-resources" in plain_claim, pods["plain"]["status"]
            assert results["plain"]["consumedCapacity"] == {"memory": "20Gi"}
            assert results["mig"]["device"].startswith("gpu-"), results["mig"]
            mig_env = node.created(pods["mig"])["envs"]
            assert "NVIDIA_VISIBLE_DEVICES" not in mig_env  # CDI tells the runtime

            # Five replicas now: the claims placed at four's share (20 GiB) keep it, and the
            # Node says the edit waits for them, as `kubectl get events` shows an admin.
            earlier = {e["metadata"]["name"] for e in node_events(node)}
            await node.configure(CONFIG.replace("replicas: 4", "replicas: 5"))
            (waits,) = await new_node_events(node, "ConfigWaitsForClaims", earlier)
            assert waits["type"] == "Warning" and waits["count"] == 1, waits
            told = waits["message"].lower()
            for name in ("mem-a", "plain"):
                assert results[name]["device"].removeprefix("gpu-") in told, (name, told)
            assert "3 claim(s) hold the old share (20480 mib)" in told, told
            assert "the config's share is 16384 mib (5 per device)" in told, told
            # Counted at what they consumed: GPU 0 holds 2 x 40 GiB (nothing fits), GPU 1
            # 20 GiB (three shares of 16 GiB fit in the other 60).
            assert "3 new share(s) fit now" in told, told

            # The pods go: their claims are deleted and unprepared (the CDI specs removed).
            for name in [*asks, "mem-c"]:
                await node.client.delete(Pod, name, namespace=namespace)
            await observed(node.client, CLAIM, lambda c: not c, namespace=namespace, within=60)
            # (The kubelet unprepares once the containers are gone, maybe after the claims.)
            async with asyncio.timeout(30):
                while list(cdi.glob(f"{DRIVER}-claim_*.json")):  # noqa: ASYNC110 -- files
                    await asyncio.sleep(0.1)
            # No claim holds the old share any more: the edit took full effect.
            (done,) = await new_node_events(node, "ConfigFullyApplied", earlier)
            assert done["type"] == "Normal", done
            assert len(await new_node_events(node, "ConfigWaitsForClaims", earlier)) == 1
            assert await plugin.stop() == 0, plugin.stderr()


def node_events(node: OnNode, reason: str | None = None) -> list[dict[str, Any]]:
    """The Node's events as `kubectl get events` lists them (`reason`'s only, if given)."""
    selector = f"involvedObject.name={node.name}" + (f",reason={reason}" if reason else "")
    said = node.cluster.kubectl(
        "get", "events", "-n", "default", "--field-selector", selector, "-o", "json"
    )
    found: list[dict[str, Any]] = json.loads(said)["items"]
    return found


async def new_node_events(node: OnNode, reason: str, earlier: set[str]) -> list[dict[str, Any]]:
    """The Node's `reason` events not in `earlier`, once there is one (watched for)."""
    await observed(
        node.client,
        Event,
        lambda found: any(e.reason == reason and n not in earlier for n, e in found.items()),
        namespace="default",
        fields={"involvedObject.name": node.name},
        within=30,
    )
    return [e for e in node_events(node, reason) if e["metadata"]["name"] not in earlier]
