"""The node label and the ConfigMap, read through lightkube from a fake kube-apiserver."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from k8s_fake import ConfigMapVolume
from kube_api import ALL_PERMISSIONS, FakeKubeApi, permissions
from support.configs import sliced

from sharing_plugin.errors import KubeApiError
from sharing_plugin.sources.apiconfig import ApiConfigSource, parse_config_map_ref
from sharing_plugin.sources.filewatch import ConfigSource
from sharing_plugin.sources.kube import client_from_environment, client_from_kubeconfig
from sharing_plugin.sources.nodelabel import NodeLabelWatcher
from sharing_plugin.sources.update import ConfigUpdate, Trigger

NODE = "gpu-node-1"
LABEL = "nvidia.com/device-plugin.config"
NS, CM = "kube-system", "gpu-config"


def replicas(update: ConfigUpdate) -> int | None:
    if update.loaded is None or update.loaded.config.sharing.time_slicing is None:
        return None
    return update.loaded.config.sharing.time_slicing.resources[0].replicas


@contextlib.asynccontextmanager
async def api_client(api: FakeKubeApi, tmp: Path, token: str | None = None) -> AsyncIterator:
    client = client_from_kubeconfig(api.kubeconfig(tmp / "kubeconfig", token=token))
    try:
        yield client
    finally:
        await client.close()


class Stream:
    """Consumes an async generator in a task; `next()` waits (bounded) for the next item."""

    def __init__(self, agen: object) -> None:
        self.queue: asyncio.Queue = asyncio.Queue()
        self._agen = agen
        self.task = asyncio.create_task(self._run(), name="stream-consumer")

    async def _run(self) -> None:
        async with contextlib.aclosing(self._agen) as items:  # type: ignore[type-var]
            async for item in items:
                self.queue.put_nowait(item)

    async def next(self, within: float = 5.0) -> ConfigUpdate:
        return await asyncio.wait_for(self.queue.get(), within)

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.wait([self.task])


# --- the node label ---------------------------------------------------------------------------


async def test_label_changes_survive_expiry_drops_and_timeouts(tmp_path: Path) -> None:
    async with FakeKubeApi() as api, api_client(api, tmp_path) as client:
        api.put_node(NODE, {LABEL: "small"})
        seen: asyncio.Queue[str | None] = asyncio.Queue()
        watcher = NodeLabelWatcher(NODE, client=client, watch_timeout_s=(1, 1))
        assert await watcher.fetch() == "small"
        task = asyncio.create_task(watcher.run(seen.put_nowait))
        try:
            await api.wait_watches(1)
            api.set_node_label(NODE, LABEL, "big")
            assert await asyncio.wait_for(seen.get(), 5) == "big"
            api.close_watches(clean=False)  # connection dropped mid-stream
            api.set_node_label(NODE, LABEL, "while-away")  # lands between two watches
            assert await asyncio.wait_for(seen.get(), 5) == "while-away"
            await api.wait_watches(1)
            api.compact()
            api.expire_next_watch()
            api.close_watches(clean=True)  # the next watch gets 410 Gone: read again
            api.set_node_label(NODE, LABEL, None)
            assert await asyncio.wait_for(seen.get(), 5) is None
        finally:
            task.cancel()
            await asyncio.wait([task])


async def test_refused_credentials_are_logged_once_and_retried(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tokens = {"right": ALL_PERMISSIONS}
    async with FakeKubeApi(tokens=tokens) as api, api_client(api, tmp_path, "wrong") as client:
        api.put_node(NODE, {LABEL: "a"})
        troubles: list[str | None] = []
        watcher = NodeLabelWatcher(NODE, client=client, on_trouble=troubles.append)
        with pytest.raises(KubeApiError, match="401"):
            await watcher.fetch()
        task = asyncio.create_task(watcher.run(lambda _: None))
        try:
            async with asyncio.timeout(5):
                while sum(1 for r in api.requests if NODE in r.path + str(r.query)) < 3:
                    api.request_seen.clear()
                    await api.request_seen.wait()
        finally:
            task.cancel()
            await asyncio.wait([task])
    refused = [r for r in caplog.records if "refused the credentials" in r.getMessage()]
    assert len(refused) == 1 and refused[0].levelno == logging.ERROR
    assert troubles and troubles[-1] is not None and "401" in troubles[-1]


async def test_missing_permission_names_it(tmp_path: Path) -> None:
    tokens = {"t": permissions(("get", "nodes"), ("list", "nodes"))}  # no watch
    async with FakeKubeApi(tokens=tokens) as api, api_client(api, tmp_path, "t") as client:
        api.put_node(NODE, {LABEL: "a"})
        troubles: list[str | None] = []
        watcher = NodeLabelWatcher(NODE, client=client, on_trouble=troubles.append)
        task = asyncio.create_task(watcher.run(lambda _: None))
        try:
            async with asyncio.timeout(5):
                while not any(t and "403" in t for t in troubles):
                    api.request_seen.clear()
                    await api.request_seen.wait()
        finally:
            task.cancel()
            await asyncio.wait([task])
    text = next(t for t in troubles if t and "403" in t)
    # The API server's own words, which name the account and the verb.
    assert 'forbidden (403): nodes "gpu-node-1" is forbidden: User ' in text
    assert 'cannot watch resource "nodes"' in text
    assert text.endswith("grant the plugin's service account watch on nodes")


def test_credentials_from_the_environment(tmp_path: Path) -> None:
    assert (
        client_from_environment({}, service_account_dir=tmp_path / "none") in (None,)
        or (Path.home() / ".kube" / "config").is_file()
    )
    broken = tmp_path / "kubeconfig"
    broken.write_text("clusters: [\n")
    with pytest.raises(KubeApiError, match=r"^kubeconfig .*: cannot read: "):
        client_from_environment({"KUBECONFIG": str(broken)}, service_account_dir=tmp_path)


# --- the ConfigMap ----------------------------------------------------------------------------


def test_config_map_reference_is_namespace_slash_name() -> None:
    assert parse_config_map_ref("kube-system/gpu-config") == ("kube-system", "gpu-config")
    for bad in ("gpu-config", "/x", "ns/", "a/b/c"):
        with pytest.raises(ValueError, match="NAMESPACE/NAME"):
            parse_config_map_ref(bad)


async def test_edits_through_the_api_are_followed_with_located_errors(tmp_path: Path) -> None:
    async with FakeKubeApi() as api, api_client(api, tmp_path) as client:
        api.put_configmap(NS, CM, {"default": sliced(2), "big": sliced(8)})
        label: list[str | None] = [None]
        source = ApiConfigSource(client, NS, CM, label_value=lambda: label[0])
        first = await source.start()
        assert (first.name, replicas(first)) == ("default", 2)
        stream = Stream(source.updates())
        try:
            api.put_configmap(NS, CM, {"default": sliced(3), "big": sliced(8)})
            assert replicas(await stream.next()) == 3
            api.put_configmap(NS, CM, {"default": sliced(0), "big": sliced(8)})
            broken = await stream.next()
            assert broken.error is not None
            line = str(broken.error).splitlines()[0]
            assert line.startswith(f"{NS}/{CM}[default]:6:19: sharing.timeSlicing.resources[0]")
            assert "replicas" in line
            label[0] = "big"  # the node label names another config
            source.trigger(Trigger.LABEL_CHANGED)
            switched = await stream.next()
            assert switched.error is not None  # 'default' is still broken: nothing selected
            api.put_configmap(NS, CM, {"default": sliced(4), "big": sliced(8)})
            assert (await stream.next()).name == "big"
            api.delete_configmap(NS, CM)
            gone = await stream.next()
            assert gone.error is not None and "does not exist" in str(gone.error)
        finally:
            source.stop()
            await stream.close()


async def test_api_down_at_start_serves_the_mounted_copy_until_the_api_answers(
    tmp_path: Path,
) -> None:
    volume = ConfigMapVolume(tmp_path / "cm", {"default": sliced(2)})
    async with FakeKubeApi() as api, api_client(api, tmp_path) as client:
        api.put_configmap(NS, CM, {"default": sliced(5)})
        await api.down()
        mounted = ConfigSource(volume.root)
        source = ApiConfigSource(
            client, NS, CM, fallback=mounted, start_timeout_s=0.5, watch_timeout_s=(1, 1)
        )
        first = await source.start()
        assert replicas(first) == 2  # the mounted copy
        assert source.trouble is not None
        stream = Stream(source.updates())
        try:
            volume.update({"default": sliced(3)})  # the mount changes while the API is away
            assert replicas(await stream.next()) == 3
            await api.up()
            back = await stream.next(within=15)  # the API's copy wins once it answers
            assert replicas(back) == 5
            assert source.trouble is None
            volume.update({"default": sliced(7)})  # a late mount never takes over
            api.put_configmap(NS, CM, {"default": sliced(6)})
            assert replicas(await stream.next()) == 6
        finally:
            source.stop()
            await stream.close()


async def test_the_api_going_away_keeps_the_copy_in_use(tmp_path: Path) -> None:
    volume = ConfigMapVolume(tmp_path / "cm", {"default": sliced(1)})
    async with FakeKubeApi() as api, api_client(api, tmp_path) as client:
        api.put_configmap(NS, CM, {"default": sliced(4)})
        troubled = asyncio.Event()
        source = ApiConfigSource(
            client,
            NS,
            CM,
            fallback=ConfigSource(volume.root),
            on_trouble=lambda text: troubled.set() if text else None,
        )
        assert replicas(await source.start()) == 4
        stream = Stream(source.updates())
        try:
            await api.wait_watches(1)
            await api.down()  # the older mounted copy must not take over: no flapping
            await asyncio.wait_for(troubled.wait(), 5)
            volume.update({"default": sliced(9)})  # ...until it changes: then it is newer
            assert replicas(await stream.next()) == 9
        finally:
            source.stop()
            await stream.close()
            await api.up()


@pytest.mark.subprocess
@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_in_cluster_service_account_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-nodes", "-keyout", str(tmp_path / "ca.key"), "-out", str(tmp_path / "ca.crt"),
         "-days", "1", "-subj", "/CN=fake-ca"],
        check=True, capture_output=True,
    )  # fmt: skip
    (tmp_path / "token").write_text("abc\n")
    (tmp_path / "namespace").write_text("kube-system\n")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    assert client_from_environment({}, service_account_dir=tmp_path) is not None


@pytest.mark.subprocess
async def test_exec_plugin_credentials_work(tmp_path: Path) -> None:
    """An EKS/GKE/AKS-style kubeconfig: the token comes from a command (client.authentication)."""
    plugin = tmp_path / "get-token"
    plugin.write_text(
        "#!/bin/sh\n"
        'echo \'{"apiVersion": "client.authentication.k8s.io/v1beta1", '
        '"kind": "ExecCredential", "status": {"token": "from-exec"}}\'\n'
    )
    plugin.chmod(0o755)
    async with FakeKubeApi(tokens={"from-exec": ALL_PERMISSIONS}) as api:
        api.put_node(NODE, {LABEL: "exec"})
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
            f"clusters:\n- name: k\n  cluster:\n    server: {api.url}\n"
            "users:\n- name: u\n  user:\n    exec:\n"
            "      apiVersion: client.authentication.k8s.io/v1beta1\n"
            f"      command: {plugin}\n"
            "contexts:\n- name: c\n  context:\n    cluster: k\n    user: u\n"
        )
        client = client_from_environment(
            {"KUBECONFIG": str(kubeconfig)}, service_account_dir=tmp_path / "none"
        )
        assert client is not None
        try:
            assert await NodeLabelWatcher(NODE, client=client).fetch() == "exec"
        finally:
            await client.close()
