"""Pods written for the device plugin, served by run-dra: a container asking `nvidia.com/gpu: 2`
(or a shared name) gets a claim of the DeviceClass whose `extendedResourceName` is that name,
and the plugin prepares it as any claim. The classes are deploy/dra's, as applied; the
scheduler's part (DRAExtendedResource: the pod's special claim and its allocation) is played by
tests/support/dra, since neither realdra136 nor the real API server schedules pods. The real API
server's validation of these classes: test_realapi_dra_classes.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from dra_harness import DRIVER, DraRun, dra_running
from support.dra.allocator import (
    allocate,
    allocated_devices,
    consumed_capacity,
    extended_resource_claim,
)

from sharing_plugin.dra.claims import ClaimRef

CLASSES = Path(__file__).resolve().parents[2] / "deploy" / "dra" / "deviceclasses.yaml"


def pod(name: str, limits: dict[str, Any]) -> dict[str, Any]:
    """A pod as written for the device plugin: the GPU in its container's limits."""
    return {
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]},
    }


def scheduled(run: DraRun, the_pod: dict[str, Any]) -> ClaimRef:
    """What the scheduler does for such a pod on a DRA node: its claim, allocated."""
    claim = extended_resource_claim(the_pod, classes=run.api.dra_objects("deviceclasses"))
    claims = run.api.dra_objects("resourceclaims")
    claim["status"] = {
        "allocation": allocate(
            claim,
            slices=run.api.dra_objects("resourceslices"),
            classes=run.api.dra_objects("deviceclasses"),
            allocated=allocated_devices(claims),
            consumed=consumed_capacity(claims),
        )
    }
    stored = run.api.put_dra_object(claim)
    return ClaimRef("default", claim["metadata"]["name"], stored["metadata"]["uid"])


def visible(run: DraRun, ref: ClaimRef) -> list[str]:
    spec = json.loads((run.root / "cdi" / f"{DRIVER}-claim_{ref.uid}.json").read_text())
    env = [e for d in spec["devices"] for e in d["containerEdits"]["env"]]
    (line,) = set(env)
    return line.removeprefix("NVIDIA_VISIBLE_DEVICES=").split(",")


def apply_deploy_classes(run: DraRun) -> None:
    for document in yaml.safe_load_all(CLASSES.read_text()):
        if document:
            run.api.put_dra_object(document)


async def test_a_pod_asking_nvidia_com_gpu_gets_whole_gpus_through_dra(short_dir: Path) -> None:
    async with dra_running(short_dir, "version: v1\n") as run:
        published = await run.published(8)
        apply_deploy_classes(run)
        ref = scheduled(run, pod("trainer", {"nvidia.com/gpu": 2, "cpu": "1"}))
        answer = await run.prepare(ref)
        assert answer.error == ""
        assert len(answer.devices) == 2
        uuids = {d.attributes["uuid"]["string"] for d in published}
        found = visible(run, ref)
        assert len(set(found)) == 2 and set(found) <= uuids


async def test_a_pod_asking_the_shared_name_gets_a_replica(short_dir: Path) -> None:
    config = (
        "version: v1\ndra:\n  sharedDevices: replicas\nsharing:\n  timeSlicing:\n"
        "    renameByDefault: true\n    resources:\n      - name: nvidia.com/gpu\n"
        "        replicas: 2\n"
    )
    async with dra_running(short_dir, config) as run:
        await run.published(16)
        apply_deploy_classes(run)
        refs = [scheduled(run, pod(f"p{i}", {"nvidia.com/gpu.shared": 1})) for i in range(3)]
        for ref in refs:
            assert (await run.prepare(ref)).error == ""
        # Each got one replica of the shared resource (its class), never a whole GPU.
        assert run.daemon.preparer is not None
        for ref in refs:
            (uuid,) = visible(run, ref)
            assert uuid.startswith("GPU-")
            (device,) = run.daemon.preparer.prepared[ref.uid].devices
            assert device.device.rsplit("-", 1)[1].startswith("r"), device.device
