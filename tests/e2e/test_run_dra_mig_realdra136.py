"""`sharing-plugin run-dra` with dynamic MIG against real Kubernetes 1.36 code (`realdra136`:
the structured allocator with partitionable devices on, the kubelet's 1.36 DRA manager; its
README in ../shared/tools). Skipped where the tools are absent (a user's clone); CI has them.

What only the real code proves: the allocator reads our counter sets and placements as we mean
them (a 3g.40gb claim at slice 0 leaves no room for the 7g.80gb until it is released), the
kubelet takes the CDI device of the MIG instance we made, and a restarted plugin unprepares
what the first one prepared and destroys its instance. The simulated GPUs live in the plugin's
process, so across a restart the node file says what the GPU kept (the instance at 3g.40gb@0):
the simulator gives an instance at the same place the same UUID, as the GPU would keep it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import realdra
import yaml_fast
from plugin_process import PluginProcess
from realdra import RealDra

from sharing_plugin.backends import backend_from_spec
from sharing_plugin.config.loader import parse_config
from sharing_plugin.nvml.discover import discover
from sharing_plugin.nvml.mig_ops import create_compute_instance, create_gpu_instance
from sharing_plugin.plan.node import plan_node
from sharing_plugin.views.dra import dra_documents

DRIVER = realdra.DRIVER
NODE = "node-1"
CONFIG = "version: v1\npartitioning:\n  mig:\n    - devices: all\n      dynamic: true\n"
THREE_AT_0 = f'device.attributes["{DRIVER}"].migStart == 0'
PLACEMENTS = 7 + 7 + 4 + 3 + 2 + 1 + 1  # every start of every A100 profile

pytestmark = [
    pytest.mark.skipif(
        not realdra.available("realdra136"), reason=realdra.skip_reason("realdra136")
    ),
    pytest.mark.realtools,
]


def node_file(root: Path, *instances: str) -> Path:
    """One A100-SXM4-80GB with MIG on, holding `instances` (what the GPU kept)."""
    path = root / "node.yaml"
    mig: dict[str, Any] = {"enabled": True}
    if instances:
        mig["instances"] = list(instances)
    gpu = {"product": "NVIDIA A100-SXM4-80GB", "mig": mig}
    path.write_text(yaml_fast.dump({"gpus": [gpu]}), encoding="utf-8")
    return path


@pytest.fixture
async def real(short_dir: Path) -> AsyncIterator[RealDra]:
    async with realdra.running("realdra136", short_dir, node=NODE) as dra:
        yield dra


def plugin(real: RealDra, root: Path, gpus: Path) -> PluginProcess:
    path = root / "config.yaml"
    path.write_text(CONFIG)
    args = ["--config", str(path), "--gpus", f"simulated:{gpus}", "--kubelet-dir", str(root)]
    args += ["--node-name", NODE, "--cdi-dir", str(root / "cdi"), "--metrics-address", "off"]
    return PluginProcess(args, {"KUBECONFIG": real.kubeconfig}, command="run-dra")


async def started(real: RealDra, gpus: Path, *, classes: bool = True) -> list[dict[str, Any]]:
    """Once registered and published: our DeviceClasses created (as `plan --format dra`
    prints them), and the pool's devices."""
    await real.ok({"cmd": "wait-plugin", "driver": DRIVER, "timeout": 15})
    cfg = parse_config(CONFIG, file="config.yaml").config
    docs = dra_documents(
        cfg, plan_node(cfg, discover(backend_from_spec(f"simulated:{gpus}"))), NODE, DRIVER
    )
    if classes:
        for document in docs:
            if document["kind"] == "DeviceClass":
                await real.create(document)
    found = await real.wait_slices(PLACEMENTS)
    return [d for s in found for d in s["spec"].get("devices") or ()]


async def claim_pod(real: RealDra, name: str, profile: str, selector: str | None = None) -> None:
    exactly: dict[str, Any] = {"deviceClassName": f"mig-{profile}.gpu.sharing-plugin.io"}
    if selector is not None:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    await real.claim_for_pod(name, exactly, node=NODE)


def pod(name: str) -> dict[str, str]:
    return {"namespace": "default", "name": name}


async def allocated(real: RealDra, name: str) -> dict[str, Any]:
    (claim,) = (await real.ok({"cmd": "allocate", "pod": pod(name)}))["claims"]
    (result,) = claim["allocation"]["devices"]["results"]
    return {"uid": claim["uid"], **result}


def spec_file(root: Path, uid: str) -> Path:
    return root / "cdi" / f"{DRIVER}-claim_{uid}.json"


def expected_mig_uuid(gpus: Path) -> str:
    """The UUID the simulated GPU gives a 3g.40gb instance made first at slice 0."""
    nvml = backend_from_spec(f"simulated:{gpus}")
    uuid = discover(nvml).gpus[0].uuid
    gi = create_gpu_instance(nvml, uuid, profile_index=2, start=0)  # GI_3_SLICE
    return str(create_compute_instance(nvml, uuid, gi_id=gi, ci_profile_index=2).uuid)


async def test_a_3g_claim_leaves_no_room_for_the_7g_and_gets_the_instance_made_for_it(
    real: RealDra, short_dir: Path
) -> None:
    gpus = node_file(short_dir)
    async with plugin(real, short_dir, gpus) as running:
        devices = await started(real, gpus)
        assert all(d.get("consumesCounters") for d in devices)
        await claim_pod(real, "three", "3g.40gb", THREE_AT_0)
        await claim_pod(real, "seven", "7g.80gb")
        three = await allocated(real, "three")
        assert three["device"].endswith("-3g-40gb-at-0")
        refused = await real.cmd({"cmd": "allocate", "pod": pod("seven")})
        assert refused["ok"] is False and "cannot allocate" in refused["error"], refused

        prepared = await real.ok({"cmd": "prepare", "pod": pod("three")})
        (container,) = prepared["containers"]
        assert container["cdiDevices"] == [f"{DRIVER}/claim={three['uid']}-{three['device']}"]
        await running.wait_for_line("created MIG instance 3g.40gb@0")
        (device,) = json.loads(spec_file(short_dir, three["uid"]).read_text())["devices"]
        mig = expected_mig_uuid(gpus)
        assert device["containerEdits"]["env"] == [f"NVIDIA_VISIBLE_DEVICES={mig}"]

        await real.ok({"cmd": "unprepare", "pod": pod("three")})
        await running.wait_for_line("destroyed MIG instance 3g.40gb@0")
        assert not spec_file(short_dir, three["uid"]).exists()
        await real.ok({"cmd": "deallocate", "claim": pod("three")})
        seven = await allocated(real, "seven")  # the slices are free again, counters whole
        assert seven["device"].endswith("-7g-80gb-at-0")
        assert await running.stop() == 0


async def test_a_restarted_plugin_keeps_the_instance_and_destroys_it_at_unprepare(
    real: RealDra, short_dir: Path
) -> None:
    gpus = node_file(short_dir)
    async with plugin(real, short_dir, gpus) as first:
        await started(real, gpus)
        await claim_pod(real, "kept", "3g.40gb", THREE_AT_0)
        kept = await allocated(real, "kept")
        await real.ok({"cmd": "prepare", "pod": pod("kept")})
        await first.wait_for_line("created MIG instance 3g.40gb@0")
        spec = spec_file(short_dir, kept["uid"]).read_text()
        first.process.kill()  # kill -9: the checkpoint is all the next one has
        await first.wait(5)
    gpus = node_file(short_dir, "3g.40gb@0")  # the GPU kept its instance
    async with plugin(real, short_dir, gpus) as second:
        await real.wait_registrations(2)
        devices = await started(real, gpus, classes=False)
        held = next(d for d in devices if d["name"] == kept["device"])
        assert held["consumesCounters"]  # a claim holds it: the allocator counts it
        await claim_pod(real, "seven", "7g.80gb")
        refused = await real.cmd({"cmd": "allocate", "pod": pod("seven")})
        assert refused["ok"] is False, refused
        await real.ok({"cmd": "prepare", "pod": pod("kept")})  # answered from the checkpoint
        assert spec_file(short_dir, kept["uid"]).read_text() == spec
        await real.ok({"cmd": "unprepare", "pod": pod("kept")})
        await second.wait_for_line("destroyed MIG instance 3g.40gb@0")
        checkpoint = (await real.ok({"cmd": "checkpoint"}))["checkpoint"]["Data"]
        assert '"ClaimInfoStateList":[]' in checkpoint
        await real.ok({"cmd": "deallocate", "claim": pod("kept")})
        assert (await allocated(real, "seven"))["device"].endswith("-7g-80gb-at-0")
        assert await second.stop() == 0
