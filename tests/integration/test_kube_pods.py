"""The pods on this node, followed through lightkube from the fake kube-apiserver."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from daemon_harness import eventually
from kube_api import FakeKubeApi, permissions

from sharing_plugin.sources.kube import client_from_kubeconfig
from sharing_plugin.sources.pods import MIRROR_ANNOTATION, NodePods

NODE = "gpu-node-1"
CID = "c" * 64


@contextlib.asynccontextmanager
async def following(
    api: FakeKubeApi, tmp: Path, token: str | None = None
) -> AsyncIterator[NodePods]:
    client = client_from_kubeconfig(api.kubeconfig(tmp / "kubeconfig", token=token))
    pods = NodePods(client, NODE, watch_timeout_s=(30, 30), backoff_s=(0.01, 0.05))
    task = asyncio.create_task(pods.run(), name="node-pods")
    try:
        yield pods
    finally:
        task.cancel()
        await asyncio.wait([task])
        await client.close()


def names(pods: NodePods) -> dict[str, tuple[str, str, dict[str, str]]]:
    return {u: (p.namespace, p.name, dict(p.containers)) for u, p in pods.by_uid.items()}


async def test_the_node_s_pods_are_listed_then_followed(tmp_path: Path) -> None:
    async with FakeKubeApi() as api:
        a = api.put_pod("ml", "train", node=NODE, containers={"main": f"containerd://{CID}"})
        api.put_pod("ml", "elsewhere", node="other-node")
        async with following(api, tmp_path) as pods:
            await asyncio.wait_for(pods.synced.wait(), 5)
            assert names(pods) == {a["metadata"]["uid"]: ("ml", "train", {CID: "main"})}
            listed = [r for r in api.requests if r.query.get("watch") != "true"]
            assert listed[-1].path == "/api/v1/pods"
            assert listed[-1].query["fieldSelector"] == f"spec.nodeName={NODE}"
            await api.wait_watches()

            b = api.put_pod("web", "infer", node=NODE, containers={"srv": f"cri-o://{'d' * 64}"})
            await eventually(lambda: b["metadata"]["uid"] in pods.by_uid)
            assert pods.by_uid[b["metadata"]["uid"]].containers == {"d" * 64: "srv"}
            api.put_pod("ml", "train", node=NODE, containers={"main": f"containerd://{'e' * 64}"})
            await eventually(
                lambda: pods.by_uid[a["metadata"]["uid"]].containers == {"e" * 64: "main"}
            )
            api.delete_pod("ml", "train")
            await eventually(lambda: a["metadata"]["uid"] not in pods.by_uid)


async def test_a_deletion_missed_while_the_watch_was_down_is_caught_by_the_next_list(
    tmp_path: Path,
) -> None:
    async with FakeKubeApi() as api:
        a = api.put_pod("ml", "train", node=NODE)
        async with following(api, tmp_path) as pods:
            await asyncio.wait_for(pods.synced.wait(), 5)
            await api.wait_watches()
            api.expire_next_watch()  # the resumed watch gets 410 Gone ...
            api.compact()
            api.close_watches(clean=False)  # ... after its connection dropped mid-stream
            api.delete_pod("ml", "train")
            b = api.put_pod("ml", "train-2", node=NODE)
            await eventually(lambda: set(pods.by_uid) == {b["metadata"]["uid"]}, within=5)
            assert a["metadata"]["uid"] not in pods.by_uid
            await api.wait_watches()  # and it watches again


async def test_the_pods_stay_known_while_the_api_server_is_away(tmp_path: Path) -> None:
    async with FakeKubeApi() as api:
        a = api.put_pod("ml", "train", node=NODE, containers={"main": f"containerd://{CID}"})
        async with following(api, tmp_path) as pods:
            await asyncio.wait_for(pods.synced.wait(), 5)
            await api.wait_watches()
            await api.down()  # the watch drops and every LIST fails, retried with backoff
            await asyncio.sleep(0.3)
            assert names(pods) == {a["metadata"]["uid"]: ("ml", "train", {CID: "main"})}
            await api.up()
            await api.wait_watches()
            assert set(pods.by_uid) == {a["metadata"]["uid"]}


async def test_a_static_pod_is_found_by_the_uid_kubelet_gave_it(tmp_path: Path) -> None:
    async with FakeKubeApi() as api:
        mirror = api.put_pod(
            "kube-system",
            "probe-gpu-node-1",
            node=NODE,
            annotations={MIRROR_ANNOTATION: "6B0D2E4F8A1C3E5B7D9F1A3C5E7B9D1F"},
        )
        async with following(api, tmp_path) as pods:
            await asyncio.wait_for(pods.synced.wait(), 5)
            assert set(pods.by_uid) == {
                mirror["metadata"]["uid"],
                "6b0d2e4f8a1c3e5b7d9f1a3c5e7b9d1f",
            }


async def test_no_permission_is_said_once_naming_what_to_grant(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sharing_plugin.sources.pods")
    tokens = {"t": permissions(("get", "nodes"))}
    async with FakeKubeApi(tokens=tokens) as api, following(api, tmp_path, token="t") as pods:
        await eventually(lambda: len([r for r in api.requests if r.path == "/api/v1/pods"]) >= 4)
        assert not pods.synced.is_set()
    said = [r for r in caplog.records if "listing pods on node" in r.getMessage()]
    assert len(said) == 1
    assert "forbidden (403)" in said[0].getMessage()
    assert "deploy/components/usage" in said[0].getMessage()
