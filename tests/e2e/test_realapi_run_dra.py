"""`run-dra` as deploy/dra/ configures it, on a real kube-apiserver (tests/realapi.py): deploy/dra/
rendered by `kubectl kustomize` is accepted whole by `kubectl apply --server-side
--dry-run=server` (RBAC, the DaemonSet, the DeviceClasses with their CEL selectors compiled and
their extended resource names validated), then
applied, and `sharing-plugin run-dra` runs as a child process with its ServiceAccount's token and
its DaemonSet's env. Its ResourceSlices pass the server's resource.k8s.io/v1 validation, a pool
of more devices than one slice holds included; a claim allocated one of them (written as the
scheduler would: no scheduler runs there) is prepared over the plugin's DRA socket as the
kubelet asks; and the audit log shows every request allowed and every rule of deploy/dra/
needed. Skipped where ../shared/tools or kubectl is absent.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import grpc
import pytest
import realapi
from kustomize_render import daemonset_env, render
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Event, Namespace, Node
from lightkube.types import PatchType
from plugin_process import PluginProcess
from realapi_support import (
    Asked,
    admin,
    applied,
    decided,
    deploy_objects,
    identity,
    observed,
    rules,
)
from support.configs import sliced
from support.dra.kubelet import DraKubeletSimulator

from sharing_plugin.dra.api.dra.v1 import api_pb2 as dra
from sharing_plugin.dra.api.dra.v1 import api_pb2_grpc as dra_grpc
from sharing_plugin.dra.resources import resource_class

pytestmark = [
    pytest.mark.skipif(not realapi.AVAILABLE, reason=realapi.SKIP_REASON),
    pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed"),
    pytest.mark.kubectl,
    pytest.mark.realtools,
]

DEPLOY_DRA = Path(__file__).resolve().parents[2] / "deploy" / "dra"
DRIVER = "gpu.sharing-plugin.io"
BY_REPLICA = "dra:\n  sharedDevices: replicas\n"


def test_deploy_dra_applies_and_its_cel_selectors_compile(real_api: realapi.RealApi) -> None:
    docs = render(DEPLOY_DRA)
    # The whole of deploy/dra as the server would take it (RBAC, the DaemonSet, the DeviceClasses
    # in resource.k8s.io/v1 with their CEL selectors compiled and their extended resource names
    # validated); the same DeviceClasses as resource.k8s.io/v1beta1 without extendedResourceName,
    # as their comment says to write them for 1.32-1.33; and, to show that the dry run does
    # compile them, one whose expression does not compile. One kubectl call for all.
    classes = [
        {
            **d,
            "apiVersion": "resource.k8s.io/v1beta1",
            "metadata": {"name": realapi.unique("beta")},
            "spec": {"selectors": d["spec"]["selectors"]},
        }
        for d in docs
        if d["kind"] == "DeviceClass"
    ]
    assert classes and all(
        d["apiVersion"] == "resource.k8s.io/v1" for d in docs if d["kind"] == "DeviceClass"
    )
    broken = {**classes[0], "metadata": {"name": realapi.unique("broken")}}
    broken["spec"] = {"selectors": [{"cel": {"expression": 'device.driver == "a" &&'}}]}
    # The DaemonSet with the MPS component too (mps-control beside run-dra, hostIPC).
    (with_mps,) = [
        d
        for d in render(DEPLOY_DRA, [DEPLOY_DRA / "components" / "mps"])
        if d["kind"] == "DaemonSet"
    ]
    with_mps["metadata"]["name"] = realapi.unique("with-mps")
    items = [*docs, *classes, with_mps, broken]
    said = real_api.kubectl(
        "apply",
        "--server-side",
        "--dry-run=server",
        "-f",
        "-",
        stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}),
        check=False,
    )
    assert said.count("serverside-applied (server dry run)") == len(docs) + len(classes) + 1, said
    refused = [line for line in said.splitlines() if broken["metadata"]["name"] in line]
    assert refused and "compilation failed" in refused[0], said


def devices_published(node: str, count: int, slices: int) -> Any:
    def done(found: dict[str, Any]) -> bool:
        ours = [s for s in found.values() if s["spec"]["nodeName"] == node]
        generations = {s["spec"]["pool"]["generation"] for s in ours}
        return (
            len(ours) == slices
            and len(generations) == 1
            and sum(len(s["spec"].get("devices") or ()) for s in ours) == count
        )

    return done


async def test_run_dra_as_deploy_dra_configures_it_needs_every_rule_and_no_other(
    real_api: realapi.RealApi, short_dir: Path, tmp_path: Path
) -> None:
    docs = render(DEPLOY_DRA)
    (configmap,) = [d for d in docs if d["kind"] == "ConfigMap"]
    namespace, name = configmap["metadata"]["namespace"], configmap["metadata"]["name"]
    node = realapi.unique("node")
    slices = resource_class("resource.k8s.io/v1", "ResourceSlice")
    claims = resource_class("resource.k8s.io/v1", "ResourceClaim")
    with deploy_objects():
        applied(real_api, docs)
        account = next(d for d in docs if d["kind"] == "ServiceAccount")["metadata"]
        plugin = identity(real_api, tmp_path, namespace=namespace, account=account["name"])
        async with admin(real_api) as cluster:
            await cluster.create(Node(metadata=ObjectMeta(name=node)))

            async def edit(text: str) -> None:
                await cluster.patch(
                    ConfigMap,
                    name,
                    {"data": {"default": text}},
                    namespace=namespace,
                    patch_type=PatchType.MERGE,
                )

            await edit(configmap["data"]["default"])
            mounted = short_dir / "config"  # the mounted copy, the API's fallback
            mounted.mkdir()
            for key, text in configmap["data"].items():
                (mounted / key).write_text(text)
            env = {
                **daemonset_env(docs, node=node),
                "KUBELET_DIR": str(short_dir),
                "CDI_DIR": str(short_dir / "cdi"),
                "CONFIG_FILE": str(mounted),
                "GPUS": "simulated:dgx-a100-80gb",
                "METRICS_ADDRESS": "off",
                "KUBECONFIG": str(plugin.kubeconfig),
            }
            on_node = {"spec.nodeName": node}
            # The kubelet's plugin watcher: the slices are published once it registered us.
            kubelet = DraKubeletSimulator(short_dir)
            async with kubelet, PluginProcess([], env, command="run-dra") as process:
                await observed(
                    cluster, slices, _dict(devices_published(node, 8, 1)), fields=on_node
                )
                # 160 devices: more than one ResourceSlice may hold (128), so two (one device
                # per replica; by capacity the 8 GPUs would be 8 devices).
                await edit(sliced(20) + BY_REPLICA)
                found = await observed(
                    cluster, slices, _dict(devices_published(node, 160, 2)), fields=on_node
                )
                device = min(
                    d["name"] for s in found.values() for d in s.to_dict()["spec"]["devices"]
                )
                claim = await _allocated_claim(cluster, claims, node=node, device=device)
                answer = await _prepare(short_dir, claim)
                assert answer.error == "" and [d.device_name for d in answer.devices] == [device]
                await edit(sliced(2) + BY_REPLICA)  # one slice again: the second is deleted
                await observed(
                    cluster, slices, _dict(devices_published(node, 16, 1)), fields=on_node
                )
                assert await _unprepare(short_dir, claim) == ""
                # By capacity (the default): a claim placed at 2 replicas' share, then a
                # replicas edit that waits for it, is a Node event; back to 2, the edit took
                # full effect; 3 again, the same event, counted (a patch).
                await edit(sliced(2))
                found = await observed(
                    cluster, slices, _dict(devices_published(node, 8, 1)), fields=on_node
                )
                gpu = min(d["name"] for s in found.values() for d in s.to_dict()["spec"]["devices"])
                shared = await _allocated_claim(cluster, claims, node=node, device=gpu)
                assert (await _prepare(short_dir, shared)).error == ""
                for replicas, reason, count in (
                    (3, "ConfigWaitsForClaims", 1),
                    (2, "ConfigFullyApplied", 1),
                    (3, "ConfigWaitsForClaims", 2),
                ):
                    await edit(sliced(replicas))
                    await observed(
                        cluster,
                        Event,
                        _event(reason, count),
                        namespace="default",
                        fields={"involvedObject.name": node},
                    )
                assert await process.stop() == 0, process.stderr()
    requests = decided(real_api, plugin.user, rules(docs))
    assert (
        Asked("resource.k8s.io", "get", "resourceclaims", claim.namespace, claim.name) in requests
    )


def _event(reason: str, count: int) -> Any:
    return lambda found: any(e.reason == reason and (e.count or 1) == count for e in found.values())


def _dict(done: Any) -> Any:
    """`done` over the objects as plain dictionaries (generic resources)."""
    return lambda found: done({k: v.to_dict() for k, v in found.items()})


async def _allocated_claim(client: Any, kind: Any, *, node: str, device: str) -> dra.Claim:
    """A ResourceClaim for one device, allocated `device` of the node's pool as the scheduler
    would write it (no scheduler runs here)."""
    namespace = realapi.unique("claims")
    await client.create(Namespace(metadata=ObjectMeta(name=namespace)))
    name = "gpu-claim"
    created = await client.create(
        kind.from_dict(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {
                    "devices": {
                        "requests": [
                            {"name": "gpu", "exactly": {"deviceClassName": f"gpu.{DRIVER}"}}
                        ]
                    }
                },
            }
        )
    )
    result = {"request": "gpu", "driver": DRIVER, "pool": node, "device": device}
    await client.patch(
        kind.Status,
        name,
        {"status": {"allocation": {"devices": {"results": [result]}}}},
        namespace=namespace,
        patch_type=PatchType.MERGE,
    )
    return dra.Claim(namespace=namespace, name=name, uid=created.metadata.uid)


async def _unprepare(kubelet_dir: Path, claim: dra.Claim) -> str:
    """NodeUnprepareResources on the plugin's DRA socket; the claim's error ("" for none)."""
    (socket,) = (kubelet_dir / "plugins" / DRIVER).glob("dra-*.sock")
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        response = await dra_grpc.DRAPluginStub(channel).NodeUnprepareResources(
            dra.NodeUnprepareResourcesRequest(claims=[claim])
        )
    return str(response.claims[claim.uid].error)


async def _prepare(kubelet_dir: Path, claim: dra.Claim) -> Any:
    """NodePrepareResources on the plugin's DRA socket, as the kubelet calls it."""
    plugin = kubelet_dir / "plugins" / DRIVER
    async with asyncio.timeout(10):
        while not (found := list(plugin.glob("dra-*.sock"))):  # noqa: ASYNC110 -- another process's socket
            await asyncio.sleep(0.02)
        (socket,) = found
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            response = await dra_grpc.DRAPluginStub(channel).NodePrepareResources(
                dra.NodePrepareResourcesRequest(claims=[claim])
            )
    return response.claims[claim.uid]
