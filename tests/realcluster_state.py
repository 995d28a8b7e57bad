"""What a test on the real cluster (tests/realcluster.py) reads from the node and does to it
beyond its pods: the devices the kubelet says each pod holds, a simulated node file whose
`faults` the test appends to, and the whole cluster restarted under a running test.

    holds = await held(node)                  # (pod, resource) -> device IDs, from PodResources
    gpus = node_file(short_dir, "t4x4")       # GPUS=simulated:<gpus>
    append_fault(gpus, {"gpu": 2, "xid": 79})
    await restarted(node)                     # kubelet checkpoints, etcd and pods kept
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import realcluster
import yaml
from realapi_support import observed
from realcluster_support import SLICE, OnNode

from sharing_plugin.kubelet.podresources import PodResourcesClient
from sharing_plugin.sources.kube import client_from_kubeconfig

PRESETS = Path(__file__).resolve().parents[1] / "sharing_plugin" / "sim" / "nvml" / "presets"


async def held(node: OnNode) -> dict[tuple[str, str], list[str]]:
    """(pod, resource) -> the device IDs the real PodResources API says the pod holds."""
    client = PodResourcesClient(node.cluster.kubelet_root)
    try:
        replicas = await client.held_replicas()
    finally:
        await client.close()
    assert replicas is not None
    found: dict[tuple[str, str], list[str]] = {}
    for r in replicas:
        found.setdefault((r.holder.pod, r.resource), []).append(r.device_id)
    return found


def node_file(directory: Path, preset: str) -> Path:
    """A simulated node file with `preset`'s GPUs (named as the preset, so its UUIDs are the
    preset's), for a test to append faults to."""
    data = yaml.safe_load((PRESETS / f"{preset}.yaml").read_text())
    path = directory / "gpus.yaml"
    path.write_text(yaml.safe_dump({**data, "name": preset, "faults": []}))
    return path


def append_fault(path: Path, fault: dict[str, Any]) -> None:
    """Append one entry to the node file's `faults`, replacing the file in one rename."""
    data = yaml.safe_load(path.read_text())
    data["faults"] = [*(data.get("faults") or []), fault]
    partial = path.with_name(path.name + ".partial")
    partial.write_text(yaml.safe_dump(data))
    partial.replace(path)


async def restarted(node: OnNode) -> None:
    """The cluster stopped and started again on its directory (a node rebooting with pods
    bound to it); `node` then talks to the new one (its API server may listen elsewhere), and
    the plugin's kubeconfig names it (its ServiceAccount token stays valid: the signing key is
    kept)."""
    await node.client.close()
    node.cluster = await asyncio.to_thread(realcluster.restart, node.cluster)
    node.client = client_from_kubeconfig(node.cluster.kubeconfig)
    config = yaml.safe_load(node.account.read_text())
    token = config["users"][0]["user"]["token"]
    namespace = config["contexts"][0]["context"]["namespace"]
    node.cluster.token_kubeconfig(node.account, token, namespace=namespace)


async def slices_when(
    node: OnNode, done: Callable[[dict[str, Any]], bool], *, within: float = 60.0
) -> dict[str, Any]:
    """The node's ResourceSlices (as dictionaries, by name) once `done(them)` holds."""
    found = await observed(
        node.client,
        SLICE,
        lambda s: done({k: v.to_dict() for k, v in s.items()}),
        fields={"spec.nodeName": node.name},
        within=within,
    )
    return {k: v.to_dict() for k, v in found.items()}
