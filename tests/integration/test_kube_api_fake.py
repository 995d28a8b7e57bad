"""The fake kube-apiserver (tests/integration/kube_api/), driven through lightkube's AsyncClient
(and raw httpx2 where lightkube cannot ask for something), as the code under test will use it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any, TypeVar

import httpx2
import lightkube
import pytest
from kube_api import ALL_PERMISSIONS, FakeKubeApi, permissions
from lightkube import ApiError
from lightkube.models.core_v1 import ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Event, Node
from lightkube.types import PatchType, on_error_retry

NS = "kube-system"
T = TypeVar("T")


async def soon(awaitable: Awaitable[T], limit: float = 3.0) -> T:
    async with asyncio.timeout(limit):
        return await awaitable


@contextlib.asynccontextmanager
async def kube_client(
    api: FakeKubeApi, tmp_path: Path, *, token: str | None = None
) -> AsyncIterator[lightkube.AsyncClient]:
    path = api.kubeconfig(tmp_path / f"kubeconfig-{token}", token=token, namespace=NS)
    client = lightkube.AsyncClient(config=lightkube.KubeConfig.from_file(path))
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def api() -> AsyncIterator[FakeKubeApi]:
    async with FakeKubeApi() as server:
        yield server


@pytest.fixture
async def client(api: FakeKubeApi, tmp_path: Path) -> AsyncIterator[lightkube.AsyncClient]:
    async with kube_client(api, tmp_path) as c:
        yield c


async def raw_lines(response: httpx2.Response) -> AsyncIterator[dict[str, Any]]:
    async for line in response.aiter_lines():
        if line:
            yield json.loads(line)


# -- get / list --------------------------------------------------------------------------------


async def test_get_and_list_configmaps(api: FakeKubeApi, client: lightkube.AsyncClient) -> None:
    api.put_configmap(NS, "gpu-config", {"config.yaml": "version: v1\n"})
    api.put_configmap(NS, "other", {"a": "b"})
    api.put_configmap("default", "elsewhere", {"a": "b"})

    cm = await client.get(ConfigMap, "gpu-config", namespace=NS)
    assert cm.data == {"config.yaml": "version: v1\n"}
    assert cm.metadata.name == "gpu-config"
    assert cm.metadata.namespace == NS
    assert cm.metadata.uid
    assert cm.metadata.creationTimestamp is not None
    assert (
        cm.metadata.resourceVersion
        == api.configmap(NS, "gpu-config")["metadata"]["resourceVersion"]
    )

    listed = client.list(ConfigMap, namespace=NS)
    names = [item.metadata.name async for item in listed]
    assert names == ["gpu-config", "other"]
    assert int(listed.resourceVersion) >= int(cm.metadata.resourceVersion)
    one = [c.metadata.name async for c in client.list(ConfigMap, fields={"metadata.name": "other"})]
    assert one == ["other"]

    with pytest.raises(ApiError) as err:
        await client.get(ConfigMap, "missing", namespace=NS)
    assert err.value.status.code == 404
    assert err.value.status.message == 'configmaps "missing" not found'

    # lightkube reuses one keep-alive connection for all of that
    assert api.connections == 1
    assert [r.path for r in api.requests][:2] == [
        "/api/v1/namespaces/kube-system/configmaps/gpu-config",
        "/api/v1/namespaces/kube-system/configmaps",
    ]


async def test_get_and_list_nodes(api: FakeKubeApi, client: lightkube.AsyncClient) -> None:
    api.put_node("gpu-1", {"nvidia.com/gpu.present": "true"})
    api.put_node("cpu-1")
    node = await client.get(Node, "gpu-1")
    assert node.metadata.labels == {"nvidia.com/gpu.present": "true"}
    assert node.metadata.namespace is None  # cluster-scoped
    names = [n.metadata.name async for n in client.list(Node)]
    assert names == ["cpu-1", "gpu-1"]
    picked = [n.metadata.name async for n in client.list(Node, fields={"metadata.name": "cpu-1"})]
    assert picked == ["cpu-1"]
    labelled = [
        n.metadata.name async for n in client.list(Node, labels={"nvidia.com/gpu.present": "true"})
    ]
    assert labelled == ["gpu-1"]
    with pytest.raises(ApiError) as err:
        await client.get(Node, "nope")
    assert err.value.status.message == 'nodes "nope" not found'


# -- watch -------------------------------------------------------------------------------------


async def test_watch_without_version_lists_first_then_follows(
    api: FakeKubeApi, client: lightkube.AsyncClient
) -> None:
    api.put_configmap(NS, "gpu-config", {"k": "1"})
    api.put_configmap(NS, "unrelated", {"k": "1"})
    watch = client.watch(ConfigMap, namespace=NS, fields={"metadata.name": "gpu-config"})
    async with contextlib.aclosing(watch) as stream:
        kind, cm = await soon(anext(stream))
        assert (kind, cm.data) == ("ADDED", {"k": "1"})
        first_rv = int(cm.metadata.resourceVersion)
        await api.wait_watches(1)

        api.put_configmap(NS, "unrelated", {"k": "2"})  # filtered out by the field selector
        api.put_configmap(NS, "gpu-config", {"k": "1"})  # no change: no event, no new version
        api.put_configmap(NS, "gpu-config", {"k": "2"})
        kind, cm = await soon(anext(stream))
        assert (kind, cm.data) == ("MODIFIED", {"k": "2"})
        assert int(cm.metadata.resourceVersion) > first_rv

        api.delete_configmap(NS, "gpu-config")
        kind, cm = await soon(anext(stream))
        assert kind == "DELETED"
        assert cm.metadata.name == "gpu-config"
        api.put_configmap(NS, "gpu-config", {"k": "3"})
        kind, cm = await soon(anext(stream))
        assert (kind, cm.data) == ("ADDED", {"k": "3"})
    watch_request = api.requests[-1]
    assert watch_request.query == {
        "watch": "true",
        "fieldSelector": "metadata.name=gpu-config",
    }
    await soon(_until(lambda: api.open_watches == 0))


def next_event(stream: AsyncIterator[T]) -> asyncio.Future[T]:
    """lightkube sends a watch request only when asked for the next event: ask in a task, so the
    test can wait for the watch to be open (`wait_watches`) before it changes things."""
    return asyncio.ensure_future(anext(stream))


async def _until(predicate: Any) -> None:
    while not predicate():  # noqa: ASYNC110 (a state of the fake, no event to wait on)
        await asyncio.sleep(0.01)


async def test_watch_resumes_after_clean_close_from_last_version(
    api: FakeKubeApi, client: lightkube.AsyncClient
) -> None:
    api.put_node("gpu-1", {"a": "1"})
    start = client.list(Node)
    _ = [n async for n in start]
    watch = client.watch(
        Node, fields={"metadata.name": "gpu-1"}, resource_version=start.resourceVersion
    )
    async with contextlib.aclosing(watch) as stream:
        api.set_node_label("gpu-1", "a", "2")  # before the watch is open: replayed from history
        api.set_node_label("gpu-1", "b", "x")
        kind, node = await soon(anext(stream))
        assert (kind, node.metadata.labels) == ("MODIFIED", {"a": "2"})
        kind, node = await soon(anext(stream))
        assert (kind, node.metadata.labels) == ("MODIFIED", {"a": "2", "b": "x"})
        last_rv = node.metadata.resourceVersion

        api.request_seen.clear()
        api.close_watches(clean=True)  # as a server-side timeout: lightkube watches again
        following = asyncio.ensure_future(anext(stream))
        await soon(api.request_seen.wait())
        again = api.requests[-1]
        assert again.query["resourceVersion"] == last_rv
        await api.wait_watches(1)
        api.set_node_label("gpu-1", "b", None)
        kind, node = await soon(following)
        assert (kind, node.metadata.labels) == ("MODIFIED", {"a": "2"})


async def test_label_selector_watch_sees_objects_enter_and_leave(
    api: FakeKubeApi, client: lightkube.AsyncClient
) -> None:
    api.put_node("n1", {"gpu": "yes"})
    async with contextlib.aclosing(client.watch(Node, labels={"gpu": "yes"})) as stream:
        assert (await soon(anext(stream)))[0] == "ADDED"
        await api.wait_watches(1)
        api.set_node_label("n1", "gpu", "no")
        kind, node = await soon(anext(stream))
        assert (kind, node.metadata.labels) == ("DELETED", {"gpu": "no"})
        api.set_node_label("n1", "gpu", "yes")
        assert (await soon(anext(stream)))[0] == "ADDED"


async def test_compacted_history_and_expired_watch_answer_410(
    api: FakeKubeApi, client: lightkube.AsyncClient
) -> None:
    api.put_configmap(NS, "gpu-config", {"k": "1"})
    old_rv = api.configmap(NS, "gpu-config")["metadata"]["resourceVersion"]
    api.put_configmap(NS, "gpu-config", {"k": "2"})
    api.compact()
    watch = client.watch(ConfigMap, namespace=NS, resource_version=old_rv)
    async with contextlib.aclosing(watch) as stream:
        with pytest.raises(ApiError) as err:
            await soon(anext(stream))
    assert err.value.status.code == 410
    assert err.value.status.reason == "Expired"
    assert api.open_watches == 0

    # the current version is still fine after a compaction
    current = api.configmap(NS, "gpu-config")["metadata"]["resourceVersion"]
    watch = client.watch(ConfigMap, namespace=NS, resource_version=current)
    async with contextlib.aclosing(watch) as stream:
        event = next_event(stream)
        await api.wait_watches(1)
        api.put_configmap(NS, "gpu-config", {"k": "3"})
        assert (await soon(event))[0] == "MODIFIED"

    # expire_next_watch: 410 even for a current version; lightkube's retry starts over
    # without a version and gets the state as ADDED
    api.expire_next_watch()
    watch = client.watch(ConfigMap, namespace=NS, resource_version=current, on_error=on_error_retry)
    async with contextlib.aclosing(watch) as stream:
        kind, cm = await soon(anext(stream))
        assert (kind, cm.data) == ("ADDED", {"k": "3"})
    assert api.requests[-2].query["resourceVersion"] == current
    assert "resourceVersion" not in api.requests[-1].query


async def test_bookmarks_only_for_watches_that_allow_them(api: FakeKubeApi) -> None:
    api.put_configmap(NS, "gpu-config", {"k": "1"})
    rv = api.configmap(NS, "gpu-config")["metadata"]["resourceVersion"]
    path = f"/api/v1/namespaces/{NS}/configmaps"
    async with httpx2.AsyncClient(base_url=api.url) as http:
        with_marks = {"watch": "true", "resourceVersion": rv, "allowWatchBookmarks": "true"}
        without = {"watch": "true", "resourceVersion": rv}
        async with (
            http.stream("GET", path, params=with_marks) as marked,
            http.stream("GET", path, params=without) as plain,
        ):
            assert marked.status_code == plain.status_code == 200
            await api.wait_watches(2)
            api.put_node("elsewhere")  # bumps the global version: the bookmark carries it
            api.send_bookmarks()
            marked_events = raw_lines(marked)
            bookmark = await soon(anext(marked_events))
            assert bookmark == {
                "type": "BOOKMARK",
                "object": {
                    "kind": "ConfigMap",
                    "apiVersion": "v1",
                    "metadata": {
                        "resourceVersion": api.node("elsewhere")["metadata"]["resourceVersion"]
                    },
                },
            }
            api.put_configmap(NS, "gpu-config", {"k": "2"})
            plain_events = raw_lines(plain)
            assert (await soon(anext(plain_events)))["type"] == "MODIFIED"  # no BOOKMARK first
            assert (await soon(anext(marked_events)))["type"] == "MODIFIED"
            await marked_events.aclose()
            await plain_events.aclose()


async def test_timeout_seconds_ends_the_stream_cleanly(
    api: FakeKubeApi, client: lightkube.AsyncClient
) -> None:
    api.put_node("gpu-1")
    rv = api.node("gpu-1")["metadata"]["resourceVersion"]
    started = time.monotonic()
    async with httpx2.AsyncClient(base_url=api.url) as http:
        params = {"watch": "true", "resourceVersion": rv, "timeoutSeconds": "1"}
        watch = client.watch(Node, server_timeout=1, resource_version=rv)
        async with (
            http.stream("GET", "/api/v1/nodes", params=params) as raw,
            contextlib.aclosing(watch) as stream,
        ):
            event = next_event(stream)
            await api.wait_watches(2)
            api.set_node_label("gpu-1", "a", "1")
            kind, node = await soon(event)
            assert kind == "MODIFIED"
            # the raw stream: the event, then a clean end (terminating chunk) after ~1 s
            lines = [line async for line in raw_lines(raw)]
            assert [e["type"] for e in lines] == ["MODIFIED"]
            assert time.monotonic() - started >= 0.9
            # lightkube's stream ended the same way; it watches again from the last version
            api.request_seen.clear()
            event = next_event(stream)
            await soon(api.request_seen.wait())
            again = api.requests[-1]
            assert again.query["resourceVersion"] == node.metadata.resourceVersion
            assert again.query["timeoutSeconds"] == "1"
            await api.wait_watches(1)
            api.set_node_label("gpu-1", "a", "2")
            kind, node = await soon(event)
            assert node.metadata.labels == {"a": "2"}


async def test_dropped_connection_breaks_the_stream(
    api: FakeKubeApi, client: lightkube.AsyncClient
) -> None:
    api.put_node("gpu-1")
    async with contextlib.aclosing(client.watch(Node)) as stream:
        assert (await soon(anext(stream)))[0] == "ADDED"
        await api.wait_watches(1)
        api.close_watches(clean=False)
        with pytest.raises(httpx2.RemoteProtocolError):
            await soon(anext(stream))
    await soon(_until(lambda: api.open_watches == 0))


async def test_down_refuses_connections_until_up(
    api: FakeKubeApi, client: lightkube.AsyncClient
) -> None:
    api.put_node("gpu-1")
    url = api.url
    assert (await client.get(Node, "gpu-1")).metadata.name == "gpu-1"
    async with contextlib.aclosing(client.watch(Node)) as stream:
        await soon(anext(stream))
        await api.down()
        with pytest.raises(httpx2.TransportError):
            await soon(anext(stream))
    assert api.open_watches == 0
    with pytest.raises(httpx2.ConnectError):
        await client.get(Node, "gpu-1")
    await api.up()
    assert api.url == url
    assert (await client.get(Node, "gpu-1")).metadata.name == "gpu-1"


async def test_wait_watches_times_out(api: FakeKubeApi) -> None:
    with pytest.raises(TimeoutError):
        await api.wait_watches(1, timeout=0.05)


# -- patch / create ----------------------------------------------------------------------------


async def test_merge_and_strategic_patch_of_node_labels(
    api: FakeKubeApi, client: lightkube.AsyncClient
) -> None:
    api.put_node("gpu-1", {"a": "1", "b": "2"}, annotations={"note": "x"})
    before = int(api.node("gpu-1")["metadata"]["resourceVersion"])
    async with contextlib.aclosing(client.watch(Node, resource_version=str(before))) as stream:
        event = next_event(stream)
        await api.wait_watches(1)
        patched = await client.patch(
            Node,
            "gpu-1",
            {"metadata": {"labels": {"a": None, "c": "3"}}},
            patch_type=PatchType.MERGE,
        )
        assert patched.metadata.labels == {"b": "2", "c": "3"}
        assert patched.metadata.annotations == {"note": "x"}
        assert int(patched.metadata.resourceVersion) > before
        kind, node = await soon(event)
        assert (kind, node.metadata.labels) == ("MODIFIED", {"b": "2", "c": "3"})

        request = api.requests[-1]
        assert request.method == "PATCH"
        assert request.path == "/api/v1/nodes/gpu-1"
        assert request.headers["content-type"] == "application/merge-patch+json"
        assert request.body == {"metadata": {"labels": {"a": None, "c": "3"}}}

        # strategic merge (lightkube's default) merges the label map the same way
        patched = await client.patch(Node, "gpu-1", {"metadata": {"labels": {"b": None}}})
        assert patched.metadata.labels == {"c": "3"}
        assert api.requests[-1].headers["content-type"] == "application/strategic-merge-patch+json"
        assert (await soon(anext(stream)))[0] == "MODIFIED"

        # a patch that changes nothing keeps the version and sends no event
        rv = patched.metadata.resourceVersion
        same = await client.patch(Node, "gpu-1", {"metadata": {"labels": {"c": "3"}}})
        assert same.metadata.resourceVersion == rv
        api.set_node_label("gpu-1", "d", "4")
        kind, node = await soon(anext(stream))
        assert node.metadata.labels == {"c": "3", "d": "4"}  # the next event is this one

    with pytest.raises(ApiError) as err:
        await client.patch(Node, "gpu-1", [{"op": "remove"}], patch_type=PatchType.JSON)
    assert err.value.status.code == 415
    with pytest.raises(ApiError) as err:
        await client.patch(Node, "gpu-1", {"metadata": {"labels": {"bad": "no spaces"}}})
    assert err.value.status.code == 422
    assert err.value.status.message.startswith('Node "gpu-1" is invalid: metadata.labels: ')
    with pytest.raises(ApiError) as err:
        await client.patch(Node, "gone", {"metadata": {"labels": {"a": "1"}}})
    assert err.value.status.message == 'nodes "gone" not found'
    with pytest.raises(ApiError) as err:
        stale = {"metadata": {"resourceVersion": "1", "labels": {"a": "1"}}}
        await client.patch(Node, "gpu-1", stale, patch_type=PatchType.MERGE)
    assert err.value.status.code == 409


async def test_create_list_and_patch_events(
    api: FakeKubeApi, client: lightkube.AsyncClient
) -> None:
    event = Event(
        metadata=ObjectMeta(generateName="gpu-1.", namespace="default"),
        involvedObject=ObjectReference(kind="Node", name="gpu-1", apiVersion="v1"),
        reason="ConfigApplied",
        message="sharing config applied",
        type="Normal",
        count=1,
    )
    created = await client.create(event)
    assert created.metadata.name.startswith("gpu-1.")
    assert len(created.metadata.name) == len("gpu-1.") + 5
    assert created.metadata.uid
    assert api.requests[-1].path == "/api/v1/namespaces/default/events"
    assert [e["reason"] for e in api.events("default")] == ["ConfigApplied"]
    assert api.events(NS) == []

    listed = [e.metadata.name async for e in client.list(Event, namespace="default")]
    assert listed == [created.metadata.name]

    patched = await client.patch(
        Event, created.metadata.name, {"count": 2}, namespace="default", patch_type=PatchType.MERGE
    )
    assert patched.count == 2
    assert api.events()[0]["count"] == 2

    # as kube-apiserver validates core/v1 Events: one about a cluster-scoped object (no
    # involvedObject.namespace) belongs in "default"
    misplaced = Event(
        metadata=ObjectMeta(name="gpu-1.x", namespace=NS),
        involvedObject=ObjectReference(kind="Node", name="gpu-1"),
        reason="ConfigApplied",
    )
    with pytest.raises(ApiError) as err:
        await client.create(misplaced)
    assert err.value.status.code == 422
    assert err.value.status.message == (
        'Event "gpu-1.x" is invalid: involvedObject.namespace: Invalid value: "": '
        "does not match event.namespace"
    )
    with pytest.raises(ApiError) as err:
        await client.create(
            Event(
                metadata=ObjectMeta(name=created.metadata.name),
                involvedObject=ObjectReference(kind="Node", name="gpu-1"),
            ),
            namespace="default",
        )
    assert err.value.status.code == 409


# -- authentication and authorization -------------------------------------------------------------


async def test_unauthorized_and_forbidden(tmp_path: Path) -> None:
    tokens = {
        "reader": permissions(("get", "configmaps"), ("list", "configmaps"), ("get", "nodes")),
        "admin": ALL_PERMISSIONS,
    }
    async with FakeKubeApi(tokens=tokens) as api:
        api.put_configmap(NS, "gpu-config", {"k": "v"})
        api.put_node("gpu-1")
        for token in (None, "wrong"):
            async with kube_client(api, tmp_path, token=token) as anonymous:
                with pytest.raises(ApiError) as err:
                    await anonymous.get(ConfigMap, "gpu-config", namespace=NS)
                assert (err.value.status.code, err.value.status.message) == (401, "Unauthorized")

        user = 'User "system:serviceaccount:kube-system:sharing-plugin"'
        async with kube_client(api, tmp_path, token="reader") as reader:
            assert (await reader.get(ConfigMap, "gpu-config", namespace=NS)).data == {"k": "v"}
            watch = reader.watch(ConfigMap, namespace=NS, fields={"metadata.name": "gpu-config"})
            async with contextlib.aclosing(watch) as stream:
                # lightkube's watch raises a plain HTTPStatusError for a non-200 answer, its
                # body already closed: the message is read with a plain request below
                with pytest.raises(httpx2.HTTPStatusError) as denied:
                    await soon(anext(stream))
            assert denied.value.response.status_code == 403
            async with httpx2.AsyncClient(base_url=api.url) as http:
                answer = await http.get(
                    f"/api/v1/namespaces/{NS}/configmaps",
                    params={"watch": "true", "fieldSelector": "metadata.name=gpu-config"},
                    headers={"Authorization": "Bearer reader"},
                )
            status = answer.json()
            assert (status["code"], status["reason"]) == (403, "Forbidden")
            assert status["message"] == (
                f'configmaps "gpu-config" is forbidden: {user} cannot watch resource '
                '"configmaps" in API group "" in the namespace "kube-system"'
            )
            with pytest.raises(ApiError) as err:
                await reader.patch(Node, "gpu-1", {"metadata": {"labels": {"a": "b"}}})
            assert err.value.status.message == (
                f'nodes "gpu-1" is forbidden: {user} cannot patch resource "nodes" in API '
                'group "" at the cluster scope'
            )
            event = Event(
                metadata=ObjectMeta(generateName="x."),
                involvedObject=ObjectReference(kind="Node", name="gpu-1"),
            )
            with pytest.raises(ApiError) as err:
                await reader.create(event, namespace="default")
            assert err.value.status.message == (
                f'events is forbidden: {user} cannot create resource "events" in API group "" '
                'in the namespace "default"'
            )
        async with kube_client(api, tmp_path, token="admin") as admin:
            patched = await admin.patch(Node, "gpu-1", {"metadata": {"labels": {"a": "b"}}})
            assert patched.metadata.labels == {"a": "b"}
        assert api.requests[-1].headers["authorization"] == "Bearer admin"
