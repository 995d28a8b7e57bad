"""RBAC as deployed, on a real kube-apiserver (tests/realapi.py): deploy/ rendered by `kubectl
kustomize` and applied with `kubectl apply --server-side`, then `run` started as its DaemonSet
configures it, with its ServiceAccount's token (`kubectl create token`). The server's audit log
holds the real authorizer's decision on every request it made: each must be allowed, and each
rule of the rendered roles must have allowed one of them (no two rules grant the same verb on
the same resource, so without that rule it would be refused). `run-dra` with deploy/dra/ is
tests/e2e/test_realapi_run_dra.py. Skipped where ../shared/tools or kubectl is absent.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import realapi
from daemon_harness import flat_options, running
from k8s_fake import ConfigMapVolume
from kustomize_render import daemonset_env, render
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Event, Node
from lightkube.types import PatchType
from realapi_support import (
    GPU,
    STATE_LABEL,
    admin,
    applied,
    decided,
    deploy_objects,
    identity,
    observed,
    rules,
)
from support.configs import sliced
from test_deploy_rbac import options_from

from sharing_plugin.sources.kube import client_from_kubeconfig

pytestmark = [
    pytest.mark.skipif(not realapi.AVAILABLE, reason=realapi.SKIP_REASON),
    pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed"),
    pytest.mark.kubectl,
    pytest.mark.realtools,
]

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


async def test_run_as_deploy_configures_it_needs_every_rule_and_no_other(
    real_api: realapi.RealApi, short_dir: Path, tmp_path: Path
) -> None:
    docs = render(DEPLOY)
    (configmap,) = [d for d in docs if d["kind"] == "ConfigMap"]
    namespace, name = configmap["metadata"]["namespace"], configmap["metadata"]["name"]
    node = realapi.unique("node")
    options = options_from(daemonset_env(docs, node=node), short_dir)
    assert options.source.config_map == (namespace, name) and options.source.node_name == node
    kept = {
        key: value
        for key, value in flat_options(options).items()
        if key not in ("config_path", "gpus", "kubelet_dir", "drain_recheck_s")
    }
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

            def rejected(count: int) -> Any:
                def done(events: dict[str, Any]) -> bool:
                    return any(
                        e.reason == "ConfigRejected" and (e.count or 1) == count
                        for e in events.values()
                    )

                return done

            def failed(nodes: dict[str, Any]) -> bool:
                return nodes[node].metadata.labels.get(STATE_LABEL) == "failed"

            await edit(configmap["data"]["default"])  # whatever an earlier test left there
            volume = ConfigMapVolume(short_dir / "config", configmap["data"])
            client = client_from_kubeconfig(plugin.kubeconfig)
            on_node = {"involvedObject.name": node}
            try:
                async with running(
                    short_dir, None, config_path=volume.root, kube_client=client, **kept
                ) as run:
                    assert run.capacity() == {GPU: 8}  # the example's default: whole GPUs
                    await edit(sliced(2))
                    await run.kubelet.wait_for(lambda: run.kubelet.capacity(GPU) == 16, timeout=5)
                    await edit(sliced(0))
                    await observed(cluster, Event, rejected(1), namespace="default", fields=on_node)
                    await edit(sliced(3))
                    await run.kubelet.wait_for(lambda: run.kubelet.capacity(GPU) == 24, timeout=5)
                    await edit(sliced(0))  # the same rejection again: its event is patched
                    await observed(cluster, Event, rejected(2), namespace="default", fields=on_node)
                    # Its state label too, before the plugin stops (a stop cancels a write).
                    await observed(cluster, Node, failed, fields={"metadata.name": node})
            finally:
                await client.close()
    decided(real_api, plugin.user, rules(docs))
