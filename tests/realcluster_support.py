"""What the tests on the real cluster (tests/realcluster.py) share: the plugin run beside the
cluster as its DaemonSet pod would be, with deploy/'s RBAC and a token of its ServiceAccount;
the deployed ConfigMap edited as an admin edits it; pods in namespaces of the test's own; and
waiting on the cluster's objects through watches.

    async with on_node(cluster, short_dir) as node:
        await node.configure(sliced(2))
        async with node.plugin("simulated:t4x4") as plugin:
            await node.allocatable(lambda a: a.get(GPU) == "8")
            pod = await node.pod(await node.namespace(), "a", {GPU: 1})

A session leaves the node as it found it: its namespaces deleted and their pods gone (their
devices back), the node's config label removed, its plugin stopped and the Node listing none of
its devices allocatable.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import realcluster
from kustomize_render import DEPLOY, daemonset_env, render
from lightkube import AsyncClient
from lightkube.core.resource_registry import resource_registry
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.core_v1 import Container, PodSpec, ResourceRequirements
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Event, Namespace, Node, Pod, ServiceAccount
from lightkube.types import PatchType
from plugin_process import PluginProcess
from realapi import unique
from realapi_support import observed
from realcluster import RealCluster

from sharing_plugin.dra.resources import resource_class
from sharing_plugin.sources.kube import client_from_kubeconfig

# Every real-cluster test module's `pytestmark`: it runs kubectl and the real binary, skips where
# they are absent, and may run minutes: the kubelet writes the Node's allocatable every 10 s, a
# test waits for several of them, and the cluster serves one test at a time.
CLUSTER_TEST_MARKS = [
    pytest.mark.realtools,
    pytest.mark.kubectl,
    pytest.mark.skipif(not realcluster.AVAILABLE, reason=realcluster.SKIP_REASON),
    pytest.mark.timeout(300),
]


GPU = "nvidia.com/gpu"
DRIVER = "gpu.sharing-plugin.io"
SLICE = resource_class("resource.k8s.io/v1", "ResourceSlice")
CLAIM_TEMPLATE = resource_registry.get(
    "resource.k8s.io/v1", "ResourceClaimTemplate"
) or create_namespaced_resource(
    "resource.k8s.io", "v1", "ResourceClaimTemplate", "resourceclaimtemplates"
)
CONFIG_LABEL = "nvidia.com/device-plugin.config"
STATE_LABEL = "nvidia.com/device-plugin.config.state"
DEPLOY_DRA = DEPLOY / "dra"
# The API objects deploy/ or deploy/dra/ makes (their DaemonSet is the plugin run here, on the
# host; their ConfigMap is the test's to write).
_DEPLOYED = {
    "ServiceAccount",
    "Role",
    "ClusterRole",
    "RoleBinding",
    "ClusterRoleBinding",
    "DeviceClass",
}


def sliced(replicas: int, name: str = GPU, **flags: str) -> str:
    """A config time-slicing every GPU into `replicas` of `name`."""
    text = "version: v1\n"
    if flags:
        text += "flags:\n" + "".join(f"  {k}: {v}\n" for k, v in flags.items())
    return text + (
        "sharing:\n  timeSlicing:\n    resources:\n"
        f"      - name: {name}\n        replicas: {replicas}\n"
    )


@dataclass
class OnNode:
    """One test's use of the cluster's node; see the module docstring."""

    cluster: RealCluster
    client: AsyncClient
    account: Path  # the plugin's kubeconfig: its ServiceAccount's token
    env: dict[str, str]  # the DaemonSet's env on this node, for this host
    config_dir: Path  # the mounted copy of the ConfigMap (the plugin's fallback)
    namespaces: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.cluster.node

    async def configure(self, default: str, **named: str) -> None:
        """The deployed ConfigMap holds `default` (and `named` configs), as `kubectl apply` of
        it would leave it; its mounted copy follows."""
        data = {"default": default, **named}
        namespace, name = self.env["CONFIG_MAP"].split("/")
        config_map = ConfigMap(metadata=ObjectMeta(name=name, namespace=namespace), data=data)
        await self.client.apply(config_map, field_manager="tests", force=True)
        for old in self.config_dir.iterdir():
            old.unlink()
        for key, text in data.items():
            (self.config_dir / key).write_text(text)

    def plugin(self, gpus: str, *, command: str = "run", **env: str) -> PluginProcess:
        """`sharing-plugin COMMAND` beside the cluster, as the DaemonSet runs it on the node."""
        return PluginProcess([], {**self.env, "GPUS": gpus, **env}, command=command)

    async def label(self, config: str | None) -> None:
        """The node's config label set to `config` (removed for None)."""
        await self.client.patch(
            Node,
            self.name,
            {"metadata": {"labels": {CONFIG_LABEL: config}}},
            patch_type=PatchType.MERGE,
        )

    async def node_when(
        self, done: Callable[[dict[str, Any]], bool], *, within: float = 60.0
    ) -> dict[str, Any]:
        """The Node (as a dictionary), once `done(it)` holds."""
        found = await observed(
            self.client,
            Node,
            lambda nodes: self.name in nodes and done(nodes[self.name].to_dict()),
            fields={"metadata.name": self.name},
            within=within,
        )
        node: dict[str, Any] = found[self.name].to_dict()
        return node

    async def allocatable(
        self, done: Callable[[dict[str, str]], bool], *, within: float = 60.0
    ) -> dict[str, str]:
        """The Node's allocatable, once `done(it)` holds (the kubelet writes it at its status
        updates, every 10 s)."""
        node = await self.node_when(lambda n: done(n["status"]["allocatable"]), within=within)
        allocatable: dict[str, str] = node["status"]["allocatable"]
        return allocatable

    async def event(self, reason: str, since: float, *, within: float = 10.0) -> dict[str, Any]:
        """The Node's latest Event of `reason` seen last at or after `since` (a time.time())."""

        def fresh(events: dict[str, Any]) -> list[dict[str, Any]]:
            found = [e.to_dict() for e in events.values()]
            return [
                e
                for e in found
                if e["involvedObject"].get("name") == self.name
                and e.get("reason") == reason
                and _seconds(e.get("lastTimestamp") or e.get("eventTime")) >= int(since)
            ]

        found = await observed(
            self.client, Event, lambda e: bool(fresh(e)), namespace="default", within=within
        )
        return fresh(found)[-1]

    async def namespace(self) -> str:
        """A namespace of this test's, once its `default` ServiceAccount exists (pods need it;
        the controller-manager makes it a moment after the namespace)."""
        name = unique("t")
        await self.client.create(Namespace(metadata=ObjectMeta(name=name)))
        self.namespaces.append(name)
        await observed(self.client, ServiceAccount, lambda a: "default" in a, namespace=name)
        return name

    async def pod(
        self, namespace: str, name: str, limits: Mapping[str, int], *, template: str | None = None
    ) -> Pod:
        """A pod of one container asking `limits` (extended resources: requests = limits), and
        a claim made from the ResourceClaimTemplate named `template`."""
        amounts = {k: str(v) for k, v in limits.items()}
        claims = [{"name": "gpu"}] if template else None
        spec = PodSpec(
            containers=[
                Container(
                    name="main",
                    image="registry.k8s.io/pause:3.10",
                    resources=ResourceRequirements(limits=amounts or None, claims=claims),
                )
            ],
            resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": template}]
            if template
            else None,
            terminationGracePeriodSeconds=0,
        )
        created: Pod = await self.client.create(
            Pod(metadata=ObjectMeta(name=name, namespace=namespace), spec=spec)
        )
        return created

    async def claim_template(
        self, namespace: str, name: str, device_class: str, **exactly: Any
    ) -> None:
        """A ResourceClaimTemplate asking one device of `device_class` (and `exactly`'s other
        fields: selectors, capacity)."""
        request = {"name": "gpu", "exactly": {"deviceClassName": device_class, **exactly}}
        await self.client.create(
            CLAIM_TEMPLATE.from_dict(
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaimTemplate",
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": {"spec": {"devices": {"requests": [request]}}},
                }
            )
        )

    async def pod_when(
        self,
        namespace: str,
        name: str,
        done: Callable[[dict[str, Any]], bool],
        *,
        within: float = 60.0,
    ) -> dict[str, Any]:
        """The pod (as a dictionary) once `done(it)` holds."""
        found = await observed(
            self.client,
            Pod,
            lambda pods: name in pods and done(pods[name].to_dict()),
            namespace=namespace,
            fields={"metadata.name": name},
            within=within,
        )
        pod: dict[str, Any] = found[name].to_dict()
        return pod

    async def running(self, namespace: str, name: str, *, within: float = 60.0) -> dict[str, Any]:
        return await self.pod_when(namespace, name, phase("Running"), within=within)

    def created(self, pod: dict[str, Any] | Pod) -> dict[str, Any]:
        """The one CreateContainer the runtime was asked for the pod's container."""
        uid = pod.metadata.uid if isinstance(pod, Pod) else pod["metadata"]["uid"]
        records = self.cluster.created_containers(uid)
        assert len(records) == 1, records
        return records[0]


def _seconds(stamp: Any) -> int:
    """An API timestamp (a datetime or RFC 3339 text) as whole seconds since the epoch."""
    if stamp is None:
        return 0
    if isinstance(stamp, str):
        stamp = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return int(stamp.timestamp())


def phase(want: str) -> Callable[[dict[str, Any]], bool]:
    return lambda pod: pod.get("status", {}).get("phase") == want


def unschedulable(pod: dict[str, Any]) -> str | None:
    """The scheduler's message on a pod it could not place (None while it has not said so)."""
    for condition in pod.get("status", {}).get("conditions") or ():
        if condition["type"] == "PodScheduled" and condition.get("reason") == "Unschedulable":
            message: str = condition.get("message", "")
            return message
    return None


@contextlib.asynccontextmanager
async def on_node(
    cluster: RealCluster, workdir: Path, deploy: Path = DEPLOY
) -> AsyncIterator[OnNode]:
    """The node for one test: `deploy`'s RBAC (and DeviceClasses) applied, a token of its
    ServiceAccount; the node left clean at the end (see the module docstring)."""
    docs = render(deploy)
    deployed = [d for d in docs if d["kind"] in _DEPLOYED]
    cluster.kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        "-",
        stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": deployed}),
    )
    (account,) = [d["metadata"] for d in deployed if d["kind"] == "ServiceAccount"]
    token = cluster.kubectl("create", "token", account["name"], "-n", account["namespace"])
    kubeconfig = cluster.token_kubeconfig(
        workdir / "plugin.kubeconfig", token.strip(), namespace=account["namespace"]
    )
    config_dir = workdir / "config"
    config_dir.mkdir()
    env = {
        **daemonset_env(docs, node=cluster.node),
        "KUBELET_DIR": str(cluster.kubelet_root),
        "CONFIG_FILE": str(config_dir),
        "CDI_DIR": str(workdir / "cdi"),
        "METRICS_ADDRESS": "off",
        "LOG_FORMAT": "text",
        "KUBECONFIG": str(kubeconfig),
    }
    client = client_from_kubeconfig(cluster.kubeconfig)
    node = OnNode(cluster, client, kubeconfig, env, config_dir)
    try:
        yield node
    finally:
        try:
            await _clean(node)
        finally:
            await client.close()


async def _clean(node: OnNode) -> None:
    """The test's namespaces deleted and their pods gone; the config label removed; the node's
    ResourceSlices deleted; none of our names allocatable."""
    for namespace in node.namespaces:
        with contextlib.suppress(Exception):
            await node.client.delete(Namespace, namespace)
    await node.label(None)
    on_node_field = {"spec.nodeName": node.name}

    def ours_gone(pods: dict[str, Any]) -> bool:
        return not any(p.metadata.namespace in node.namespaces for p in pods.values())

    async with asyncio.timeout(30):
        while True:  # pods of several namespaces: a list per look (observed keys by name)
            pods = {
                f"{p.metadata.namespace}/{p.metadata.name}": p
                async for p in node.client.list(Pod, namespace="*", fields=on_node_field)
            }
            if ours_gone(pods):
                break
            await asyncio.sleep(0.2)
    # A stopped run-dra's slices stay until the kubelet wipes them, 30 s after it deregistered:
    # gone now, so that the next test does not see this one's pool as its own.
    node.cluster.kubectl(
        "delete", "resourceslices", "--field-selector", f"spec.nodeName={node.name}"
    )
    # The plugin stopped: the Node lists none of its devices allocatable any more (at the
    # kubelet's next status update), so the next test does not read this one's counts.
    await node.node_when(
        lambda n: all(
            count == "0"
            for name, count in n["status"]["allocatable"].items()
            if name.startswith("nvidia.com/")
        )
    )
