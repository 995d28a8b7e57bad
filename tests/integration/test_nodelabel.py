"""NodeLabelWatcher and KubeClient against a real local HTTP server speaking the Node API."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from k8s_fake import ConfigMapVolume, FakeKubeApi

from sharing_plugin.errors import KubeApiError
from sharing_plugin.sources.filewatch import ConfigSource
from sharing_plugin.sources.nodelabel import DEFAULT_LABEL, KubeClient, NodeLabelWatcher

NODE = "gpu-node-1"


class Changes:
    """Runs the watcher in a task and queues every value it reports."""

    def __init__(self, watcher: NodeLabelWatcher) -> None:
        self.queue: asyncio.Queue[str | None] = asyncio.Queue()
        self.task = asyncio.create_task(watcher.run(self.queue.put_nowait), name="label-watch")

    async def next(self, within: float = 5.0) -> str | None:
        return await asyncio.wait_for(self.queue.get(), within)


@contextlib.asynccontextmanager
async def following(watcher: NodeLabelWatcher) -> AsyncIterator[Changes]:
    changes = Changes(watcher)
    try:
        yield changes
    finally:
        changes.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await changes.task


async def watch_open(api: FakeKubeApi, count: int = 1) -> None:
    async with asyncio.timeout(5):
        while api.open_watches < count:
            api.watch_started.clear()
            await api.watch_started.wait()


def gets(api: FakeKubeApi) -> int:
    return sum(1 for r in api.requests if r.path == f"/api/v1/nodes/{NODE}")


async def test_label_changes_are_reported() -> None:
    async with FakeKubeApi(NODE, {DEFAULT_LABEL: "small"}, token="s3cret") as api:
        watcher = NodeLabelWatcher(NODE, client=KubeClient(api.url, token="s3cret"))
        assert await watcher.fetch() == "small"
        async with following(watcher) as changes:
            await watch_open(api)
            api.set_label("other/label", "x")  # not ours: no call
            api.set_label(DEFAULT_LABEL, "big")
            assert await changes.next() == "big"
            assert watcher.value == "big"
            api.set_label(DEFAULT_LABEL, None)
            assert await changes.next() is None
        watch = next(r for r in api.requests if r.query.get("watch") == "true")
        assert watch.query["fieldSelector"] == f"metadata.name={NODE}"
        assert watch.query["resourceVersion"] == "100"
        assert watch.headers["authorization"] == "Bearer s3cret"
        assert changes.queue.empty()


async def test_reconnects_after_the_server_closes_the_watch() -> None:
    async with FakeKubeApi(NODE) as api:
        watcher = NodeLabelWatcher(NODE, client=KubeClient(api.url))
        async with following(watcher) as changes:
            await watch_open(api)
            api.close_watches()
            api.set_label(DEFAULT_LABEL, "while-away")  # lands between two watches
            assert await changes.next() == "while-away"
            await watch_open(api)
            api.set_label(DEFAULT_LABEL, "after")
            assert await changes.next() == "after"
        assert watcher.reconnects >= 1
        assert gets(api) >= 2


async def test_gone_lists_again() -> None:
    async with FakeKubeApi(NODE, {DEFAULT_LABEL: "a"}) as api:
        watcher = NodeLabelWatcher(NODE, client=KubeClient(api.url))
        async with following(watcher) as changes:
            assert await changes.next() == "a"
            await watch_open(api)
            api.expire_next_watch()
            api.close_watches()  # the next watch gets 410 Gone inside the stream
            api.set_label(DEFAULT_LABEL, "b")
            assert await changes.next() == "b"
            await watch_open(api)
            api.set_label(DEFAULT_LABEL, "c")
            assert await changes.next() == "c"
        assert gets(api) >= 3  # first list, after the close, after 410


async def test_api_errors_are_survived() -> None:
    async with FakeKubeApi(NODE, {DEFAULT_LABEL: "a"}, token="right") as api:
        client = KubeClient(api.url, token="wrong")
        with pytest.raises(KubeApiError, match="HTTP 401") as raised:
            await client.get_node(NODE)
        assert raised.value.code == 401
        with pytest.raises(KubeApiError, match=r"HTTP 404.*--node-name"):
            await KubeClient(api.url, token="right").get_node("elsewhere")
        watcher = NodeLabelWatcher(NODE, client=client)
        async with following(watcher) as changes:
            # 401s, logged and retried, never raised: the server sees the watcher come back.
            async with asyncio.timeout(5):
                while gets(api) < 3:  # the direct call above, then two of the watcher's
                    api.request_seen.clear()
                    await api.request_seen.wait()
            assert not changes.task.done()
            assert changes.queue.empty()


async def test_unreachable_server_is_retried() -> None:
    async with FakeKubeApi(NODE) as api:
        url = api.url
    watcher = NodeLabelWatcher(NODE, client=KubeClient(url))
    async with following(watcher) as changes:
        await asyncio.sleep(0.4)
        assert not changes.task.done()


async def test_label_switches_the_selected_config(tmp_path: Path) -> None:
    text = (
        "version: v1\nsharing:\n  timeSlicing:\n"
        "    resources:\n    - name: gpu\n      replicas: {}\n"
    )
    volume = ConfigMapVolume(tmp_path / "cm", {"default": text.format(2), "big": text.format(8)})
    async with FakeKubeApi(NODE) as api:
        watcher = NodeLabelWatcher(NODE, client=KubeClient(api.url))
        source = ConfigSource(volume.root, label_value=lambda: watcher.value)
        assert source.read().name == "default"
        updates: asyncio.Queue[object] = asyncio.Queue()

        async def consume() -> None:
            async for update in source.updates():
                updates.put_nowait(update)

        consumer = asyncio.create_task(consume(), name="config-updates")
        async with following(watcher) as changes:
            await watch_open(api)
            api.set_label(DEFAULT_LABEL, "big")
            assert await changes.next() == "big"
            source.trigger("label changed")
            update = await asyncio.wait_for(updates.get(), 5)
            assert getattr(update, "name", None) == "big"
            api.set_label(DEFAULT_LABEL, "missing")
            assert await changes.next() == "missing"
            source.trigger("label changed")
            update = await asyncio.wait_for(updates.get(), 5)
            error = getattr(update, "error", None)
            assert error is not None
            assert "unknown config name 'missing' (node label)" in str(error)
            assert "default" in str(error) and "big" in str(error)
        source.stop()
        await asyncio.wait_for(consumer, 5)


def test_from_environment_in_cluster(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("abc\n")
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    client = KubeClient.from_environment(env, service_account_dir=tmp_path)
    assert client is not None and client.base_url == "https://10.0.0.1:443"
    assert KubeClient.from_environment({}, service_account_dir=tmp_path) is None
    assert KubeClient.from_environment(env, service_account_dir=tmp_path / "none") is None


async def test_kubeconfig_token(tmp_path: Path) -> None:
    async with FakeKubeApi(NODE, {DEFAULT_LABEL: "x"}, token="kc-token") as api:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: test\n"
            f"clusters:\n- name: fake\n  cluster:\n    server: {api.url}\n"
            "users:\n- name: admin\n  user:\n    token: kc-token\n"
            "contexts:\n- name: test\n  context:\n    cluster: fake\n    user: admin\n"
        )
        client = KubeClient.from_environment({"KUBECONFIG": str(kubeconfig)})
        assert client is not None
        watcher = NodeLabelWatcher(NODE, client=client)
        assert await watcher.fetch() == "x"


def test_kubeconfig_exec_plugin_is_refused(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "current-context: c\nclusters:\n- name: k\n  cluster:\n    server: https://k:6443\n"
        "users:\n- name: u\n  user:\n    exec:\n      command: aws\n"
        "contexts:\n- name: c\n  context:\n    cluster: k\n    user: u\n"
    )
    with pytest.raises(KubeApiError, match="exec/auth-provider plugin"):
        KubeClient.from_kubeconfig(kubeconfig)


def _make_tls(tmp: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1, made with the openssl command."""
    ca_key, ca, key, csr, cert = (tmp / n for n in ("ca.key", "ca.crt", "s.key", "s.csr", "s.crt"))
    ext = tmp / "ext.cnf"
    ext.write_text("subjectAltName=IP:127.0.0.1\n")
    run = ["openssl"]
    for args in (
        ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca,
         "-days", "1", "-subj", "/CN=fake-ca"],
        ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr,
         "-subj", "/CN=127.0.0.1"],
        ["x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
         "-out", cert, "-days", "1", "-extfile", ext],
    ):  # fmt: skip
        subprocess.run([*run, *map(str, args)], check=True, capture_output=True)
    return ca, cert, key


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
async def test_kubeconfig_https_with_ca_data(tmp_path: Path) -> None:
    ca, cert, key = _make_tls(tmp_path)
    server_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ssl.load_cert_chain(cert, key)
    async with FakeKubeApi(NODE, {DEFAULT_LABEL: "tls"}, token="t", ssl=server_ssl) as api:
        assert api.url.startswith("https://127.0.0.1:")
        ca_data = base64.b64encode(ca.read_bytes()).decode()
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            "current-context: c\n"
            f"clusters:\n- name: k\n  cluster:\n    server: {api.url}\n"
            f"    certificate-authority-data: {ca_data}\n"
            "users:\n- name: u\n  user:\n    token: t\n"
            "contexts:\n- name: c\n  context:\n    cluster: k\n    user: u\n"
        )
        watcher = NodeLabelWatcher(NODE, client=KubeClient.from_kubeconfig(kubeconfig))
        assert await watcher.fetch() == "tls"
        # Without the CA the server is not trusted.
        with pytest.raises(ssl.SSLError):
            await KubeClient(api.url, token="t").get_node(NODE)
