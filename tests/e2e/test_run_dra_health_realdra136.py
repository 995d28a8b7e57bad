"""GPU health of `sharing-plugin run-dra` against real Kubernetes 1.36 code (`realdra136` of
../shared/tools: the scheduler's structured allocator with device taints on, the kubelet's plugin
manager and DRA manager with its health cache). Skipped where the tools are absent.

What only the real code can prove: the allocator skips the device our taint marks (a claim
lands on the other GPU; with no other GPU free, allocation fails) and gives it to a claim that
tolerates the taint; recovery lifts the taint and the device is allocatable again; and the
kubelet opens our health stream by itself and keeps what we tell it (its health checkpoint,
`<kubelet-dir>/dra/dra_health_state`, the cache pod status is written from).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
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
from sharing_plugin.plan.node import plan_node
from sharing_plugin.views.dra import dra_documents

DRIVER = realdra.DRIVER
NODE = "node-1"
TAINT = f"{DRIVER}/unhealthy"
GPU_CLASS = f"gpu.{DRIVER}"
CONFIG = "version: v1\nhealth:\n  recoveryQuietPeriodSeconds: 1\n  recoveryCheckSeconds: 1\n"
NODE_FILE: dict[str, Any] = {
    "gpus": [{"product": "NVIDIA A100-SXM4-80GB", "count": 2}],
    "faults": [],
}

pytestmark = [
    pytest.mark.skipif(
        not realdra.available("realdra136"), reason=realdra.skip_reason("realdra136")
    ),
    pytest.mark.realtools,
]


@pytest.fixture
async def real(short_dir: Path) -> AsyncIterator[RealDra]:
    async with realdra.running("realdra136", short_dir, node=NODE) as dra:
        yield dra


def plugin(real: RealDra, root: Path, node_file: Path) -> PluginProcess:
    config = root / "config.yaml"
    config.write_text(CONFIG)
    args = [
        *("--config", str(config), "--gpus", f"simulated:{node_file}"),
        *("--kubelet-dir", str(root), "--node-name", NODE, "--cdi-dir", str(root / "cdi")),
        *("--metrics-address", "off"),
    ]
    return PluginProcess(args, {"KUBECONFIG": real.kubeconfig}, command="run-dra")


def fail(node_file: Path, fault: dict[str, Any]) -> None:
    """Append a fault to the simulated node (one rename, as an admin's edit would be)."""
    data = yaml_fast.load(node_file.read_text())
    data["faults"] = [*(data.get("faults") or []), fault]
    node_file.with_suffix(".tmp").write_text(yaml_fast.dump(data))
    node_file.with_suffix(".tmp").replace(node_file)


async def claim_and_pod(real: RealDra, name: str, *, tolerate: bool = False) -> None:
    exactly: dict[str, Any] = {
        "deviceClassName": GPU_CLASS,
        "allocationMode": "ExactCount",
        "count": 1,
    }
    if tolerate:
        exactly["tolerations"] = [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}]
    await real.claim_for_pod(name, exactly, node=NODE)


def pod(name: str) -> dict[str, str]:
    return {"namespace": "default", "name": name}


async def allocated_device(real: RealDra, name: str) -> str:
    (claim,) = (await real.ok({"cmd": "allocate", "pod": pod(name)}))["claims"]
    (result,) = claim["allocation"]["devices"]["results"]
    return str(result["device"])


def taints(slices: list[dict[str, Any]]) -> dict[str, list[str]]:
    return {
        d["name"]: [t["value"] for t in d.get("taints") or () if t["key"] == TAINT]
        for s in slices
        for d in s["spec"].get("devices") or ()
    }


async def kubelet_health(root: Path, done: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The kubelet's health cache of our driver, once it satisfies `done` (its checkpoint file
    is rewritten at every change it hears; it has no other window)."""
    path = root / "dra" / "dra_health_state"
    async with asyncio.timeout(10):
        while True:
            try:
                devices = json.loads(path.read_text()).get(DRIVER, {}).get("Devices", {})
            except (FileNotFoundError, json.JSONDecodeError):
                devices = {}
            if done(devices):
                return dict(devices)
            await asyncio.sleep(0.05)


async def test_a_tainted_gpu_is_skipped_tolerated_and_allocatable_again_after_recovery(
    real: RealDra, short_dir: Path
) -> None:
    node_file = short_dir / "node.yaml"
    node_file.write_text(yaml_fast.dump(NODE_FILE))
    async with plugin(real, short_dir, node_file) as running:
        await real.ok({"cmd": "wait-plugin", "driver": DRIVER, "timeout": 15})
        await real.wait_for_slices(lambda s: len(taints(s)) == 2)
        cfg = parse_config(CONFIG, file="config.yaml").config
        inventory = discover(backend_from_spec(f"simulated:{node_file}"))
        for document in dra_documents(cfg, plan_node(cfg, inventory, as_is=True), NODE, DRIVER):
            if document["kind"] == "DeviceClass":
                await real.create(document)
        sick, well = (f"gpu-{g.uuid.removeprefix('GPU-').lower()}" for g in inventory.gpus)
        # The kubelet opened the health stream by itself: both devices Healthy.
        await kubelet_health(
            short_dir,
            lambda h: {h.get(f"{NODE}/{n}", {}).get("Health") for n in (sick, well)} == {"Healthy"},
        )
        await running.wait_for_line("GPU health: watching")
        fail(node_file, {"gpu": 0, "xid": 79})
        await real.wait_for_slices(lambda s: taints(s) == {sick: ["xid-79"], well: []})
        health = await kubelet_health(
            short_dir, lambda h: h.get(f"{NODE}/{sick}", {}).get("Health") == "Unhealthy"
        )
        assert health[f"{NODE}/{sick}"]["Message"] == f"{inventory.gpus[0].uuid}: Xid 79"
        assert health[f"{NODE}/{well}"]["Health"] == "Healthy"

        # The real allocator skips the tainted GPU: the first claim lands on the other one...
        await claim_and_pod(real, "first")
        assert await allocated_device(real, "first") == well
        # ...and with that one taken, a second claim that does not tolerate the taint fails.
        await claim_and_pod(real, "second")
        refused = await real.cmd({"cmd": "allocate", "pod": pod("second")})
        assert refused["ok"] is False and "cannot allocate" in refused["error"], refused
        # A claim tolerating the taint is given the tainted GPU, and prepared on it.
        await claim_and_pod(real, "tolerant", tolerate=True)
        assert await allocated_device(real, "tolerant") == sick
        prepared = await real.ok({"cmd": "prepare", "pod": pod("tolerant")})
        (container,) = prepared["containers"]
        assert len(container["cdiDevices"]) == 1 and container["cdiDevices"][0].endswith(sick)

        # Recovery (NVML answers, 1 s without a fault) lifts the taint; once the tolerant
        # claim is gone the GPU is allocatable to the claim that was refused.
        await real.wait_for_slices(lambda s: taints(s) == {sick: [], well: []})
        await kubelet_health(
            short_dir, lambda h: h.get(f"{NODE}/{sick}", {}).get("Health") == "Healthy"
        )
        await real.ok({"cmd": "unprepare", "pod": pod("tolerant")})
        await real.ok({"cmd": "deallocate", "claim": pod("tolerant")})
        assert await allocated_device(real, "second") == sick
        assert await running.stop(timeout=2.0) == 0
