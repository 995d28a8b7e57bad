"""Selectors written for NVIDIA's DRA driver select `run-dra`'s devices, as the real Kubernetes
1.36 allocator (`realdra136`, its README in ../shared/tools) evaluates them. Skipped where the
tools are absent (a user's clone); CI has them.

The plugin runs as `--driver-name gpu.nvidia.com` (a cluster without NVIDIA's driver), so the
CEL expressions below are written as for NVIDIA's driver, unchanged: by architecture, by
compute capability compared as a version (CEL's Kubernetes semver library compares with
`compareTo`, `isGreaterThan` and `isLessThan`: `>=` between versions does not compile), and two
GPUs aligned on one PCIe root complex through the standard attribute. The node mixes
architectures and interleaves root complexes, so each claim has a wrong device to refuse first.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import realdra
from plugin_process import PluginProcess
from realdra import RealDra

from sharing_plugin.backends import backend_from_spec
from sharing_plugin.config.loader import parse_config
from sharing_plugin.nvml.discover import discover
from sharing_plugin.plan.node import plan_node
from sharing_plugin.views.dra import dra_documents

NVIDIA = "gpu.nvidia.com"
NODE = "node-1"
CLASS = "gpu.gpu.nvidia.com"  # nvidia.com/gpu's class under that driver name
CONFIG = "version: v1\n"
# Index order: A100 (root 00), T4 (root 40), A100 (root 00), T4 (root 40), H100 (root 80).
NODE_FILE = """\
gpus:
  - {product: NVIDIA A100-SXM4-80GB, numaNode: 0, pcieRoot: "pci0000:00"}
  - {product: Tesla T4, numaNode: 0, pcieRoot: "pci0000:40"}
  - {product: NVIDIA A100-SXM4-80GB, numaNode: 0, pcieRoot: "pci0000:00"}
  - {product: Tesla T4, numaNode: 0, pcieRoot: "pci0000:40"}
  - {product: NVIDIA H100 80GB HBM3, numaNode: 1, pcieRoot: "pci0000:80"}
driverVersion: "580.65.06"
"""

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


def nvidia(expression: str) -> dict[str, Any]:
    return {"cel": {"expression": expression}}


async def devices_of(real: RealDra, count: int) -> list[dict[str, Any]]:
    """The devices published under NVIDIA's driver name, once there are `count` (realdra's
    control loop offers no watch: asked every 50 ms, within a bound)."""
    async with asyncio.timeout(10):
        while True:
            found = (await real.ok({"cmd": "list", "kind": "ResourceSlice"})).get("items") or []
            devices = [
                d for s in found if s["spec"]["driver"] == NVIDIA for d in s["spec"]["devices"]
            ]
            if len(devices) == count:
                return devices
            await asyncio.sleep(0.05)


async def claim(real: RealDra, name: str, exactly: dict[str, Any], **spec: Any) -> list[str]:
    """A pod's claim of `exactly` (plus `constraints`), allocated: the devices it was given."""
    body = {"deviceClassName": CLASS, **exactly}
    await real.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": body}], **spec}},
        }
    )
    await real.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "nodeName": NODE,
                "resourceClaims": [{"name": "g", "resourceClaimName": name}],
                "containers": [
                    {"name": "c", "image": "x", "resources": {"claims": [{"name": "g"}]}}
                ],
            },
        }
    )
    answer = await real.ok({"cmd": "allocate", "pod": {"namespace": "default", "name": name}})
    (allocated,) = answer["claims"]
    return [r["device"] for r in allocated["allocation"]["devices"]["results"]]


async def test_nvidia_selectors_and_pcie_root_alignment_select_our_devices(
    real: RealDra, short_dir: Path
) -> None:
    node_file = short_dir / "node.yaml"
    node_file.write_text(NODE_FILE)
    gpus = f"simulated:{node_file}"
    config = short_dir / "config.yaml"
    config.write_text(CONFIG)
    args = ["--config", str(config), "--gpus", gpus, "--kubelet-dir", str(short_dir)]
    args += ["--node-name", NODE, "--driver-name", NVIDIA, "--cdi-dir", str(short_dir / "cdi")]
    args += ["--metrics-address", "off"]
    inventory = discover(backend_from_spec(gpus))
    cfg = parse_config(CONFIG, file="config.yaml").config
    plan = plan_node(cfg, inventory, as_is=True)
    async with PluginProcess(args, {"KUBECONFIG": real.kubeconfig}, command="run-dra") as plugin:
        await real.ok({"cmd": "wait-plugin", "driver": NVIDIA, "timeout": 15})
        for document in dra_documents(cfg, plan, NODE, NVIDIA):
            if document["kind"] == "DeviceClass":
                await real.create(document)
        published = await devices_of(real, 5)
        by_name = {d["name"]: d["attributes"] for d in published}
        uuid_of = {name: a["uuid"]["string"] for name, a in by_name.items()}
        gpu = [g.uuid for g in inventory.gpus]

        by_architecture = nvidia(f'device.attributes["{NVIDIA}"].architecture == "Turing"')
        turing = await claim(real, "turing", {"selectors": [by_architecture]})
        assert [uuid_of[d] for d in turing] == [gpu[1]]

        hopper = await claim(
            real,
            "hopper",
            {
                "selectors": [
                    nvidia(
                        f'device.attributes["{NVIDIA}"].cudaComputeCapability'
                        '.compareTo(semver("9.0.0")) >= 0'
                    )
                ]
            },
        )
        assert [uuid_of[d] for d in hopper] == [gpu[4]]

        # Two GPUs on one root complex: GPUs 0 and 1 are not, the allocator must look on.
        pair = await claim(
            real,
            "pair",
            {"allocationMode": "ExactCount", "count": 2},
            constraints=[
                {"requests": ["gpu"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}
            ],
        )
        assert sorted(uuid_of[d] for d in pair) == sorted([gpu[0], gpu[2]])
        roots = {by_name[d]["resource.kubernetes.io/pcieRoot"]["string"] for d in pair}
        assert roots == {"pci0000:00"}
        assert by_name[pair[0]]["driverVersion"] == {"version": "580.65.6"}
        assert await plugin.stop() == 0
