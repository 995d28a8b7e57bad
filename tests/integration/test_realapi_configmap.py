"""`run --config-map NS/NAME --node-name N` against a real kube-apiserver (Kubernetes 1.36, with
etcd, its watch cache, validation and RBAC; tests/realapi.py): edits, rejections, fixes, a watch
the server ends, and an API server restart. Skipped where ../shared/tools is absent.

The plugin runs as a ServiceAccount of the test's own, so the server's audit log shows its
requests: "following" is a watch the server holds open.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import realapi
from daemon_harness import running
from lightkube.resources.core_v1 import ConfigMap, Event, Node
from lightkube.types import PatchType
from realapi_support import (
    GPU,
    STATE_LABEL,
    a_node_and_its_config,
    admin,
    bind,
    identity,
    observed,
    open_watches,
    until,
    until_watching,
)
from support.configs import sliced

from sharing_plugin.sources.apiconfig import ApiConfigSource
from sharing_plugin.sources.kube import client_from_kubeconfig

pytestmark = [
    pytest.mark.skipif(not realapi.AVAILABLE, reason=realapi.SKIP_REASON),
    pytest.mark.kubectl,
    pytest.mark.realtools,
]

CM = "plugin-config"
LABEL = "nvidia.com/device-plugin.config"


async def edit(client: Any, namespace: str, data: dict[str, str]) -> None:
    await client.patch(
        ConfigMap, CM, {"data": data}, namespace=namespace, patch_type=PatchType.MERGE
    )


def state_is(node: str, state: str) -> Any:
    def done(nodes: dict[str, Any]) -> bool:
        return nodes[node].metadata.labels.get(STATE_LABEL) == state

    return done


async def test_edits_rejections_and_fixes_reach_the_kubelet_and_the_node(
    real_api: realapi.RealApi, short_dir: Path, tmp_path: Path
) -> None:
    async with admin(real_api) as cluster:
        namespace, node = await a_node_and_its_config(cluster, data={"default": sliced(2)})
        await bind(cluster, namespace, "plugin", "cluster-admin")
        plugin = identity(real_api, tmp_path, namespace=namespace, account="plugin")
        client = client_from_kubeconfig(plugin.kubeconfig)
        try:
            async with running(
                short_dir, None, config_map=(namespace, CM), node_name=node, kube_client=client
            ) as run:
                assert run.capacity() == {GPU: 16}
                await observed(
                    cluster, Node, state_is(node, "success"), fields={"metadata.name": node}
                )
                await edit(cluster, namespace, {"default": sliced(3)})
                await run.kubelet.wait_for(lambda: run.kubelet.capacity(GPU) == 24, timeout=5)

                await edit(cluster, namespace, {"default": sliced(0)})  # refused by validation
                events = await observed(
                    cluster,
                    Event,
                    lambda found: any(e.reason == "ConfigRejected" for e in found.values()),
                    namespace="default",
                    fields={"involvedObject.name": node},
                )
                rejected = next(e for e in events.values() if e.reason == "ConfigRejected")
                assert rejected.type == "Warning"
                assert rejected.message.startswith(f"{namespace}/{CM}[default]:")
                await observed(
                    cluster, Node, state_is(node, "failed"), fields={"metadata.name": node}
                )
                assert run.capacity() == {GPU: 24}  # the last good config keeps serving

                await edit(cluster, namespace, {"default": sliced(4)})
                await run.kubelet.wait_for(lambda: run.kubelet.capacity(GPU) == 32, timeout=5)
                await observed(
                    cluster, Node, state_is(node, "success"), fields={"metadata.name": node}
                )
        finally:
            await client.close()
    refused = [e for e in real_api.audit(plugin.user) if e["responseStatus"]["code"] >= 400]
    assert not refused, refused


async def test_a_restarted_api_server_is_followed_again_with_the_configmap_untouched(
    real_api_alone: realapi.RealApi, short_dir: Path, tmp_path: Path
) -> None:
    api = real_api_alone
    async with admin(api) as cluster:
        data = {"default": sliced(2), "big": sliced(8)}
        namespace, node = await a_node_and_its_config(cluster, data=data)
        await bind(cluster, namespace, "plugin", "cluster-admin")
        plugin = identity(api, tmp_path, namespace=namespace, account="plugin")
    client = client_from_kubeconfig(plugin.kubeconfig)
    try:
        async with running(
            short_dir, None, config_map=(namespace, CM), node_name=node, kube_client=client
        ) as run:
            assert run.capacity() == {GPU: 16}
            following = ("configmaps", "nodes")
            await until_watching(api, plugin.user, following, after=0, within=5)
            before = len(api.audit(plugin.user))
            # Same etcd data: its new watch cache starts at the newest resourceVersion, older
            # than neither object, so a watch from either's own version gets 410 for ever.
            api = realapi.restart(api)
            await until_watching(api, plugin.user, following, after=before, within=15)
            async with admin(api) as cluster:
                await edit(cluster, namespace, {"default": sliced(3), "big": sliced(8)})
                await run.kubelet.wait_for(lambda: run.kubelet.capacity(GPU) == 24, timeout=1)
                await cluster.patch(
                    Node, node, {"metadata": {"labels": {LABEL: "big"}}}, patch_type=PatchType.MERGE
                )
                await run.kubelet.wait_for(lambda: run.kubelet.capacity(GPU) == 64, timeout=1)
    finally:
        await client.close()


def watch_versions(api: realapi.RealApi, user: str) -> list[int]:
    """The resourceVersion each of `user`'s ConfigMap watches started from, in order."""
    versions = []
    for event in api.audit(user):
        if event["verb"] == "watch" and event["stage"] == "ResponseStarted":
            query = parse_qs(urlsplit(event["requestURI"]).query)
            versions.append(int(query["resourceVersion"][0]))
    return versions


async def test_a_watch_the_server_ends_is_taken_up_from_the_newest_version(
    real_api: realapi.RealApi, tmp_path: Path
) -> None:
    async with admin(real_api) as cluster:
        namespace, _ = await a_node_and_its_config(cluster, data={"default": sliced(2)})
        own = (await cluster.get(ConfigMap, CM, namespace=namespace)).metadata.resourceVersion
        # Newer than the ConfigMap: the list's version is past the object's own.
        await cluster.create(
            ConfigMap.from_dict({"metadata": {"name": "other", "namespace": namespace}})
        )
        await bind(cluster, namespace, "plugin", "cluster-admin")
        plugin = identity(real_api, tmp_path, namespace=namespace, account="plugin")
        client = client_from_kubeconfig(plugin.kubeconfig)
        source = ApiConfigSource(client, namespace, CM, watch_timeout_s=(1, 1))
        updates: asyncio.Queue[Any] = asyncio.Queue()

        async def follow() -> None:
            async for update in source.updates():
                updates.put_nowait(update)

        await source.start()
        task = asyncio.create_task(follow(), name="configmap-updates")
        try:
            await until_watching(real_api, plugin.user, ("configmaps",), after=0, within=5)
            first = len(real_api.audit(plugin.user))
            # The server ends the watch after its timeoutSeconds; the next one is open.
            await until(
                lambda: (
                    len(watch_versions(real_api, plugin.user)) >= 2
                    and open_watches(real_api, plugin.user, "configmaps", after=first) > 0
                ),
                within=5,
                what="the watch taken up again",
            )
            await edit(cluster, namespace, {"default": sliced(5)})
            update = await asyncio.wait_for(updates.get(), 1)
            assert update.loaded.config.sharing.time_slicing.resources[0].replicas == 5
        finally:
            source.stop()
            task.cancel()
            await asyncio.wait([task])
            await client.close()
    versions = watch_versions(real_api, plugin.user)
    assert versions[0] > int(own), "the first watch must start from the list's version"
    assert versions == sorted(versions)  # each resume from the newest version seen
