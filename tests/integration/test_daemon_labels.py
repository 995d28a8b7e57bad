"""The daemon publishing GFD-compatible labels: an NFD feature file and the Node's own labels."""

from __future__ import annotations

from pathlib import Path

from daemon_harness import eventually, running
from kube_api import FakeKubeApi
from support.configs import sliced

from sharing_plugin.sources.kube import client_from_kubeconfig

GPU = "nvidia.com/gpu"
NODE = "gpu-node-1"
PRODUCT = "nvidia.com/gpu.product"
REPLICAS = "nvidia.com/gpu.replicas"


def read_labels(path: Path) -> dict[str, str]:
    lines = path.read_text().splitlines()
    return dict(line.split("=", 1) for line in lines)


async def test_feature_file_follows_reloads_and_goes_at_exit(short_dir: Path) -> None:
    features = short_dir / "features.d"
    features.mkdir()
    path = features / "sharing-plugin"
    async with running(short_dir, sliced(4), labels_file=path) as run:
        labels = read_labels(path)
        assert labels[PRODUCT] == "NVIDIA-A100-SXM4-80GB-SHARED"
        assert labels[REPLICAS] == "4"
        assert labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
        assert labels["nvidia.com/gpu.count"] == "8"
        run.write("version: v1\n")  # no sharing any more
        await run.kubelet.wait_for(lambda: run.kubelet.capacity(GPU) == 8, timeout=5)
        await eventually(lambda: read_labels(path).get(REPLICAS) == "1")
        assert read_labels(path)[PRODUCT] == "NVIDIA-A100-SXM4-80GB"
        assert [p.name for p in features.iterdir()] == ["sharing-plugin"]  # no temp files left
    assert not path.exists()


async def test_node_labels_are_patched_and_stale_ones_removed(short_dir: Path) -> None:
    async with FakeKubeApi() as api:
        # A label an earlier run left that this config no longer gives, and someone else's.
        api.put_node(NODE, {"nvidia.com/mig.strategy": "mixed", "team": "a"})
        client = client_from_kubeconfig(api.kubeconfig(short_dir / "kubeconfig"))
        try:
            async with running(
                short_dir, sliced(2), node_name=NODE, kube_client=client, node_labels=True
            ) as run:
                reporter = run.daemon.pipeline.reports.node.reporter
                assert reporter is not None
                await reporter.flush()
                labels = api.node(NODE)["metadata"]["labels"]
                assert labels[PRODUCT] == "NVIDIA-A100-SXM4-80GB-SHARED"
                assert labels[REPLICAS] == "2"
                assert "nvidia.com/mig.strategy" not in labels  # ours, stale: removed
                assert labels["team"] == "a"  # not ours: untouched
                run.write(sliced(3))
                await run.kubelet.wait_for(lambda: run.kubelet.capacity(GPU) == 24, timeout=5)
                await reporter.flush()
                assert api.node(NODE)["metadata"]["labels"][REPLICAS] == "3"
        finally:
            await client.close()
