"""The daemon following a mounted ConfigMap and the node's config label (issue 6)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from daemon_harness import Running, running
from k8s_fake import ConfigMapVolume
from kube_api import FakeKubeApi
from support.configs import sliced
from support.observe import next_rejected

from sharing_plugin.sources.kube import client_from_kubeconfig

GPU = "nvidia.com/gpu"
LABEL = "nvidia.com/device-plugin.config"
NODE = "gpu-node-1"


def two_configs(root: Path) -> ConfigMapVolume:
    """A mounted ConfigMap with `default` (2 replicas per GPU) and `big` (8)."""
    return ConfigMapVolume(root / "cm", {"default": sliced(2), "big": sliced(8)})


@asynccontextmanager
async def labelled_big(root: Path) -> AsyncIterator[tuple[ConfigMapVolume, FakeKubeApi, Running]]:
    """The daemon following `two_configs` on a node whose config label says `big`."""
    volume = two_configs(root)
    async with FakeKubeApi() as api:
        api.put_node(NODE, {LABEL: "big"})
        client = client_from_kubeconfig(api.kubeconfig(root / "kubeconfig"))
        try:
            async with running(
                root, None, config_path=volume.root, node_name=NODE, kube_client=client
            ) as run:
                yield volume, api, run
        finally:
            await client.close()


async def test_configmap_swap_is_applied(short_dir: Path) -> None:
    volume = two_configs(short_dir)
    async with running(short_dir, None, config_path=volume.root) as run:
        assert run.capacity() == {GPU: 16}
        volume.update({"default": sliced(3), "big": sliced(8)})
        await run.kubelet.wait_for(lambda: run.kubelet.capacity(GPU) == 24, timeout=5)
        assert run.daemon.status.to_json()["config"]["name"] == "default"


async def test_label_selects_config_at_start_and_on_change(short_dir: Path) -> None:
    async with labelled_big(short_dir) as (_, api, run):
        # The labelled config from the first plan on, not the default first.
        assert run.capacity() == {GPU: 64}
        assert run.daemon.status.to_json()["config"]["generation"] == 1
        await api.wait_watches(1)
        api.set_node_label(NODE, LABEL, "default")
        await run.kubelet.wait_for(lambda: run.kubelet.capacity(GPU) == 16, timeout=5)
        assert run.daemon.status.to_json()["config"]["name"] == "default"


async def test_label_naming_an_unknown_config_keeps_the_previous_one(short_dir: Path) -> None:
    async with labelled_big(short_dir) as (_, api, run):
        await api.wait_watches(1)
        with run.daemon.pipeline.outcomes() as outcomes:
            api.set_node_label(NODE, LABEL, "huge")
            await next_rejected(outcomes)
        error = run.daemon.status.last_error
        assert error is not None and "huge" in error and "big" in error
        assert run.capacity() == {GPU: 64}


async def test_removing_the_selected_key_keeps_the_previous_config(short_dir: Path) -> None:
    async with labelled_big(short_dir) as (volume, _, run):
        with run.daemon.pipeline.outcomes() as outcomes:
            volume.update({"default": sliced(2)})
            await next_rejected(outcomes)
        error = run.daemon.status.last_error
        assert error is not None and "big" in error and "default" in error
        assert run.capacity() == {GPU: 64}
        volume.update({"default": sliced(2), "big": sliced(4)})
        await run.kubelet.wait_for(lambda: run.kubelet.capacity(GPU) == 32, timeout=5)
        assert run.daemon.status.last_error is None
