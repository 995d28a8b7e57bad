"""The daemon with the Kubernetes API: a ConfigMap read through it; the node told what happened."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from daemon_harness import Running, eventually, running
from k8s_fake import ConfigMapVolume
from kube_api import FakeKubeApi
from support.configs import sliced
from support.observe import next_rejected

from sharing_plugin.observability.nodestatus import CONFIG_ANNOTATION, STATE_LABEL
from sharing_plugin.sources.kube import client_from_kubeconfig

GPU = "nvidia.com/gpu"
NODE = "gpu-node-1"
LABEL = "nvidia.com/device-plugin.config"
NS, CM = "kube-system", "gpu-config"


@contextlib.asynccontextmanager
async def on_api(
    root: Path, data: dict[str, str], **options: Any
) -> AsyncIterator[tuple[FakeKubeApi, Running]]:
    async with FakeKubeApi() as api:
        api.put_node(NODE, options.pop("labels", {}))
        api.put_configmap(NS, CM, data)
        client = client_from_kubeconfig(api.kubeconfig(root / "kubeconfig"))
        try:
            async with running(
                root, None, node_name=NODE, config_map=(NS, CM), kube_client=client, **options
            ) as run:
                yield api, run
        finally:
            await client.close()


def reasons(api: FakeKubeApi) -> list[str]:
    return [e["reason"] for e in api.events("default")]


def node_state(api: FakeKubeApi) -> tuple[str | None, str | None]:
    meta = api.node(NODE)["metadata"]
    return meta.get("labels", {}).get(STATE_LABEL), meta.get("annotations", {}).get(
        CONFIG_ANNOTATION
    )


async def test_edit_broken_edit_and_fix_through_the_api(short_dir: Path) -> None:
    async with on_api(short_dir, {"default": sliced(2)}) as (api, run):
        assert run.capacity() == {GPU: 16}
        await run.daemon.pipeline.reports.node.reporter.flush()  # type: ignore[union-attr]
        state, annotation = node_state(api)
        assert state == "success" and annotation is not None
        assert annotation.startswith("default@")
        assert reasons(api) == ["ConfigApplied"]
        applied = api.events("default")[0]
        assert applied["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": NODE}
        assert "nvidia.com/gpu: 16" in applied["message"]

        api.put_configmap(NS, CM, {"default": sliced(3)})
        await run.kubelet.wait_for(lambda: run.kubelet.capacity(GPU) == 24, timeout=5)

        with run.daemon.pipeline.outcomes() as outcomes:
            api.put_configmap(NS, CM, {"default": sliced(0)})
            await next_rejected(outcomes)
        error = run.daemon.status.last_error
        assert error is not None and error.startswith(f"{NS}/{CM}[default]:6:19: ")
        assert run.capacity() == {GPU: 24}  # the last good config keeps serving
        await run.daemon.pipeline.reports.node.reporter.flush()  # type: ignore[union-attr]
        assert node_state(api)[0] == "failed"
        rejected = api.events("default")[-1]
        assert rejected["reason"] == "ConfigRejected" and rejected["type"] == "Warning"
        assert rejected["message"] == error

        api.put_configmap(NS, CM, {"default": sliced(4)})
        await run.kubelet.wait_for(lambda: run.kubelet.capacity(GPU) == 32, timeout=5)
        await run.daemon.pipeline.reports.node.reporter.flush()  # type: ignore[union-attr]
        state, fixed = node_state(api)
        assert state == "success" and fixed != annotation
        assert reasons(api) == ["ConfigApplied"] * 2 + ["ConfigRejected", "ConfigApplied"]


async def test_node_label_switches_the_config_inside_the_api_copy(short_dir: Path) -> None:
    data = {"default": sliced(2), "big": sliced(8)}
    async with on_api(short_dir, data, labels={LABEL: "big"}) as (api, run):
        assert run.capacity() == {GPU: 64}
        api.set_node_label(NODE, LABEL, "default")
        await run.kubelet.wait_for(lambda: run.kubelet.capacity(GPU) == 16, timeout=5)
        assert run.daemon.status.to_json()["config"]["name"] == "default"


async def test_api_down_at_start_serves_the_mounted_copy(short_dir: Path) -> None:
    volume = ConfigMapVolume(short_dir / "cm", {"default": sliced(2)})
    async with FakeKubeApi() as api:
        api.put_node(NODE, {})
        api.put_configmap(NS, CM, {"default": sliced(5)})
        client = client_from_kubeconfig(api.kubeconfig(short_dir / "kubeconfig"))
        await api.down()
        try:
            async with running(
                short_dir,
                None,
                config_path=volume.root,
                node_name=NODE,
                config_map=(NS, CM),
                kube_client=client,
            ) as run:
                assert run.capacity() == {GPU: 16}  # the mounted copy
                await api.up()
                await run.kubelet.wait_for(lambda: run.kubelet.capacity(GPU) == 40, timeout=15)
        finally:
            await client.close()


async def test_node_status_off_writes_nothing_to_the_node(short_dir: Path) -> None:
    async with on_api(short_dir, {"default": sliced(2)}, node_status=False) as (api, run):
        assert run.capacity() == {GPU: 16}
        assert run.daemon.pipeline.reports.node.reporter is None
        await eventually(lambda: api.open_watches >= 1)
    assert reasons(api) == [] and node_state(api) == (None, None)
    assert not [r for r in api.requests if r.method in ("PATCH", "POST")]


async def test_a_state_written_just_before_sigterm_still_reaches_the_node(short_dir: Path) -> None:
    """The config-state label and events go out in the background; a stop right after a
    rejected edit must not cut the write off (the last state would be lost)."""
    async with on_api(short_dir, {"default": sliced(2)}) as (api, run):
        reporter = run.daemon.pipeline.reports.node.reporter
        assert reporter is not None
        await reporter.flush()
        assert node_state(api)[0] == "success"
        api.patch_delay_s = 0.3  # an API server slow to answer, as under load
        with run.daemon.pipeline.outcomes() as outcomes:
            api.put_configmap(NS, CM, {"default": sliced(0)})
            await next_rejected(outcomes)
        run.daemon.request_stop()  # what SIGTERM does; the harness then closes the daemon
    assert node_state(api)[0] == "failed"
