"""The watch discipline of the API followers (the ConfigMap and the node label), on the fake
kube-apiserver playing the real one's watch window.

client-go's reflector is the reference: LIST, WATCH from the list's resourceVersion, resume a
watch the server ended from the newest version seen (event or BOOKMARK), LIST again on 410 Gone.
An object's own resourceVersion is never a resume point: nobody edited it for a while, so it is
older than the server's window (at once after an API server restart), and a watch from it gets
410 for ever.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from kube_api import FakeKubeApi, Request
from support.configs import sliced
from test_kube_sources import LABEL, NODE, Stream, api_client, replicas

from sharing_plugin.sources.apiconfig import ApiConfigSource
from sharing_plugin.sources.nodelabel import NodeLabelWatcher

NS, CM = "kube-system", "gpu-config"


@contextlib.asynccontextmanager
async def followed(client: Any) -> AsyncIterator[tuple[asyncio.Queue[str | None], Stream]]:
    """The node label and the ConfigMap followed as the daemon follows them."""
    labels: asyncio.Queue[str | None] = asyncio.Queue()
    watcher = NodeLabelWatcher(NODE, client=client)
    await watcher.fetch()
    source = ApiConfigSource(client, NS, CM)
    await source.start()
    task = asyncio.create_task(watcher.run(labels.put_nowait), name="label-watch")
    stream = Stream(source.updates())
    try:
        yield labels, stream
    finally:
        source.stop()
        await stream.close()
        task.cancel()
        await asyncio.wait([task])


def watches(api: FakeKubeApi) -> list[Request]:
    return [r for r in api.requests if r.query.get("watch") == "true"]


async def test_a_restarted_api_server_is_followed_again_with_the_objects_untouched(
    tmp_path: Path,
) -> None:
    async with FakeKubeApi() as api, api_client(api, tmp_path) as client:
        api.put_configmap(NS, CM, {"default": sliced(2)})
        api.put_node(NODE, {LABEL: "a"})
        api.put_configmap(NS, "someone-elses", {"k": "v"})  # newer than both followed objects
        async with followed(client) as (labels, updates):
            await api.wait_watches(2)
            await api.restart()  # its new watch cache starts at the newest version
            await api.wait_watches(2, timeout=3)
            api.put_configmap(NS, CM, {"default": sliced(3)})
            api.set_node_label(NODE, LABEL, "b")
            assert replicas(await updates.next(within=1)) == 3
            assert await asyncio.wait_for(labels.get(), 1) == "b"


async def test_a_watch_the_server_ended_after_its_window_moved_on_lists_again(
    tmp_path: Path,
) -> None:
    async with FakeKubeApi(watch_window=5) as api, api_client(api, tmp_path) as client:
        api.put_configmap(NS, CM, {"default": sliced(2)})
        api.put_node(NODE, {LABEL: "a"})
        async with followed(client) as (labels, updates):
            await api.wait_watches(2)
            opened = api.watches_opened
            for n in range(10):  # changes neither watch sees push the window past them
                api.put_configmap(NS, "busy", {"n": str(n)})
            api.close_watches(clean=True)  # the server's timeout ends both watches
            await api.wait_opened(opened + 2, timeout=3)
            api.put_configmap(NS, CM, {"default": sliced(3)})
            api.set_node_label(NODE, LABEL, "b")
            assert replicas(await updates.next(within=1)) == 3
            assert await asyncio.wait_for(labels.get(), 1) == "b"
        newest = api.configmap(NS, "busy")["metadata"]["resourceVersion"]
        for resource in ("/nodes", "/configmaps"):
            versions = [
                r.query["resourceVersion"] for r in watches(api) if r.path.endswith(resource)
            ]
            # The first watch, its resume from the same version (410: it left the window), and
            # the watch from a new LIST's version.
            assert versions == [versions[0], versions[0], newest], resource


async def test_bookmarks_move_the_resume_version_past_changes_the_watch_does_not_see(
    tmp_path: Path,
) -> None:
    async with FakeKubeApi(watch_window=5) as api, api_client(api, tmp_path) as client:
        api.put_configmap(NS, CM, {"default": sliced(2)})
        api.put_node(NODE, {LABEL: "a"})
        async with followed(client) as (labels, _):
            await api.wait_watches(2)
            opened = api.watches_opened
            for n in range(10):
                api.put_configmap(NS, "busy", {"n": str(n)})
            api.send_bookmarks()  # what the watch cache sends about once a minute
            newest = api.configmap(NS, "busy")["metadata"]["resourceVersion"]
            listed = len(api.requests)
            api.close_watches(clean=True)
            await api.wait_opened(opened + 2, timeout=3)
            resumed = watches(api)[-2:]
            assert [r.query["resourceVersion"] for r in resumed] == [newest, newest]
            assert all(r.query.get("allowWatchBookmarks") == "true" for r in resumed)
            assert len(api.requests) == listed + 2  # no LIST: the watches resumed at once
            api.set_node_label(NODE, LABEL, "b")
            assert await asyncio.wait_for(labels.get(), 1) == "b"


async def test_a_configmap_created_later_is_watched_for_not_polled(tmp_path: Path) -> None:
    async with FakeKubeApi() as api, api_client(api, tmp_path) as client:
        api.put_node(NODE, {})
        source = ApiConfigSource(client, NS, CM)
        first = await source.start()
        assert first.error is not None and "does not exist" in str(first.error)
        updates = Stream(source.updates())
        try:
            await api.wait_watches(1)  # a watch waits for it to be created
            asked = len(api.requests)
            api.put_configmap(NS, CM, {"default": sliced(4)})
            assert replicas(await updates.next(within=1)) == 4
            assert len(api.requests) == asked  # the open watch brought it
        finally:
            source.stop()
            await updates.close()
