"""`flags.useNodeFeatureAPI: true` on a real kube-apiserver (tests/realapi.py): the labels in
NFD's NodeFeature object, with NFD's CRD installed from tests/support/nfd (written from NFD's
published one) and the permissions of deploy/components/node-feature. The object is created
with the labels, updated when they change, not written when they do not (a reload, a restart),
owned by the plugin's pod, and removed with --clear-labels-on-exit on. Before the CRD is there,
the plugin says precisely what is missing and serves on. Skipped where ../shared/tools or
kubectl is absent.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import realapi
from daemon_harness import eventually, running
from kustomize_render import render
from lightkube.resources.core_v1 import Pod
from lightkube.resources.rbac_authorization_v1 import ClusterRole, ClusterRoleBinding
from realapi_support import a_node_and_its_config, admin, applied, identity, observed

from sharing_plugin.observability.nodefeature import (
    GROUP,
    NODE_NAME_LABEL,
    PLURAL,
    object_name,
)
from sharing_plugin.observability.nodefeature import _resource as node_feature_resource
from sharing_plugin.sources.kube import client_from_kubeconfig

pytestmark = [
    pytest.mark.realtools,
    pytest.mark.kubectl,
    pytest.mark.skipif(not realapi.AVAILABLE, reason=realapi.SKIP_REASON),
    pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed"),
]

CRD = Path(__file__).resolve().parents[1] / "support" / "nfd" / "nodefeature-crd.yaml"
CRD_NAME = f"{PLURAL}.{GROUP}"
GPU = "nvidia.com/gpu"
REPLICAS = "nvidia.com/gpu.replicas"


def config(replicas: int, *, extra: str = "") -> str:
    return (
        f"version: v1\nflags:\n  useNodeFeatureAPI: true\n{extra}"
        "sharing:\n  timeSlicing:\n    resources:\n"
        f"      - name: nvidia.com/gpu\n        replicas: {replicas}\n"
    )


def component_rbac(namespace: str, account: str) -> list[dict[str, Any]]:
    """The node-feature component's Role and binding, moved to `namespace` for `account`."""
    docs = [
        d
        for d in render(components=["node-feature"])
        if d["kind"] in ("Role", "RoleBinding") and d["metadata"]["name"].endswith("node-features")
    ]
    assert len(docs) == 2
    for doc in docs:
        doc["metadata"]["namespace"] = namespace
        for subject in doc.get("subjects", []):
            subject.update(namespace=namespace, name=account)
    return docs


async def grant_node_access(cluster: Any, namespace: str) -> None:
    """The base's node rules (the config label, node status), for this test's account."""
    (base,) = [d for d in render() if d["kind"] == "ClusterRole"]
    name = realapi.unique("plugin-nodes")
    await cluster.create(
        ClusterRole.from_dict({**base, "metadata": {"name": name}})  # type: ignore[arg-type]
    )
    await cluster.create(
        ClusterRoleBinding.from_dict(  # type: ignore[arg-type]
            {
                "metadata": {"name": name},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": name,
                },
                "subjects": [{"kind": "ServiceAccount", "name": "plugin", "namespace": namespace}],
            }
        )
    )


def crd_absent(api: realapi.RealApi) -> None:
    api.kubectl("delete", "crd", CRD_NAME, "--ignore-not-found", "--wait=true")


def crd_installed(api: realapi.RealApi) -> None:
    """The CRD applied, established, and its objects' storage ready: a list right after
    Established may still be answered "storage is (re)initializing"."""
    api.kubectl("apply", "-f", str(CRD))
    api.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=30s")
    deadline = time.monotonic() + 30
    while api.kubectl("get", PLURAL, "-A", check=False).count("initializing"):
        assert time.monotonic() < deadline, "the NodeFeature storage never became ready"
        time.sleep(0.2)


def writes(api: realapi.RealApi, user: str) -> list[str]:
    """The plugin's writes of NodeFeature objects, in order (verbs)."""
    return [
        e["verb"]
        for e in api.audit(user)
        if e.get("objectRef", {}).get("resource") == PLURAL
        and e["verb"] in ("create", "patch", "update", "delete")
    ]


async def test_node_feature_object_follows_the_labels_and_goes_on_clear(
    real_api: realapi.RealApi, short_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    nf = node_feature_resource()
    with realapi.held("nodefeature-crd"):
        crd_absent(real_api)
        async with admin(real_api) as cluster:
            namespace, node = await a_node_and_its_config(cluster, data={})
            applied(real_api, component_rbac(namespace, "plugin"))
            await grant_node_access(cluster, namespace)
            pod = await cluster.create(
                Pod.from_dict(  # type: ignore[arg-type]
                    {
                        "metadata": {"name": "sharing-plugin-x1", "namespace": namespace},
                        "spec": {
                            "nodeName": node,
                            "serviceAccountName": "plugin",
                            "containers": [{"name": "sharing-plugin", "image": "plugin:0"}],
                        },
                    }
                )
            )
            assert pod.metadata is not None and pod.metadata.uid
            plugin = identity(real_api, tmp_path, namespace=namespace, account="plugin")
            client = client_from_kubeconfig(plugin.kubeconfig)
            report = {
                "node_name": node,
                "node_status": False,
                "pod_namespace": namespace,
                "pod_name": "sharing-plugin-x1",
                "pod_uid": pod.metadata.uid,
            }
            name = object_name(node)
            try:
                # No NodeFeature API on the server: said once, precisely; the node is served.
                async with running(short_dir, config(2), kube_client=client, **report) as run:
                    assert run.capacity() == {GPU: 16}
                    await eventually(_logged(caplog, f"does not serve {PLURAL}.{GROUP}/v1alpha1"))
                assert writes(real_api, plugin.user) == []  # its read was refused: no write

                crd_installed(real_api)
                async with running(short_dir, config(2), kube_client=client, **report) as run:
                    found = await observed(cluster, nf, lambda o: name in o, namespace=namespace)
                    body = found[name].to_dict()
                    assert body["metadata"]["labels"] == {NODE_NAME_LABEL: node}
                    (owner,) = body["metadata"]["ownerReferences"]
                    assert (owner["kind"], owner["name"], owner["uid"]) == (
                        "Pod",
                        "sharing-plugin-x1",
                        pod.metadata.uid,
                    )
                    labels = body["spec"]["labels"]
                    assert labels[REPLICAS] == "2" and labels["nvidia.com/gpu.count"] == "8"

                    with run.daemon.pipeline.outcomes() as outcomes:  # no label changes
                        run.write(config(2, extra="  failOnInitError: false\n"))
                        await outcomes.next()
                    run.write(config(4))
                    await observed(
                        cluster,
                        nf,
                        lambda o: o[name].to_dict()["spec"]["labels"][REPLICAS] == "4",
                        namespace=namespace,
                    )
                assert writes(real_api, plugin.user) == ["create", "patch"]

                # A restart with the same labels writes nothing; the object stays at exit.
                async with running(short_dir, config(4), kube_client=client, **report) as run:
                    assert run.capacity() == {GPU: 32}
                assert writes(real_api, plugin.user) == ["create", "patch"]

                # --clear-labels-on-exit on: the object goes with the plugin.
                async with running(
                    short_dir, config(4), kube_client=client, clear_labels_on_exit=True, **report
                ):
                    pass
                await observed(cluster, nf, lambda o: name not in o, namespace=namespace)
                assert writes(real_api, plugin.user)[-1] == "delete"
            finally:
                await client.close()
    refused = [
        e
        for e in real_api.audit(plugin.user)
        if e["responseStatus"]["code"] >= 400
        # the object read before it exists, and the API read before the CRD is installed
        and not (e["verb"] == "get" and e["responseStatus"]["code"] == 404)
    ]
    assert not refused, [(e["requestURI"], e["responseStatus"]) for e in refused]


def _logged(caplog: pytest.LogCaptureFixture, text: str) -> Callable[[], bool]:
    return lambda: any(
        text in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
    )
