"""`sharing-plugin run-dra` against real Kubernetes 1.32 code: the scheduler's DRA allocator and
the kubelet's plugin manager and DRA manager (the `realdra` harness of ../shared/tools, see its
README). Skipped where the tools are absent (a user's clone); CI has them.

What only the real code can prove: the kubelet accepts our registration and picks a service we
serve, the real allocator's CEL reads our device attributes and class selectors, our slices are
what the allocator takes as a complete pool, and the kubelet's DRA manager takes our
NodePrepareResources answer and hands the container the CDI devices we named.
"""

from __future__ import annotations

import json
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
from sharing_plugin.views.dra_api import V1BETA1

DRIVER = realdra.DRIVER
NODE = "node-1"

pytestmark = [
    pytest.mark.skipif(not realdra.available("realdra"), reason=realdra.skip_reason("realdra")),
    pytest.mark.realtools,
]

SHARED_CONFIG = """\
version: v1
sharing:
  timeSlicing:
    renameByDefault: true
    resources:
      - name: gpu
        replicas: 2
"""
MIG_CONFIG = "version: v1\nflags:\n  migStrategy: mixed\n"


@pytest.fixture
async def real(short_dir: Path) -> AsyncIterator[RealDra]:
    async with realdra.running("realdra", short_dir, node=NODE) as dra:
        yield dra


def plugin(real: RealDra, root: Path, config: str, gpus: str) -> PluginProcess:
    path = root / "config.yaml"
    path.write_text(config)
    args = [
        "--config",
        str(path),
        "--gpus",
        gpus,
        "--kubelet-dir",
        str(root),
        "--node-name",
        NODE,
        "--cdi-dir",
        str(root / "cdi"),
        "--metrics-address",
        "off",
    ]
    return PluginProcess(args, {"KUBECONFIG": real.kubeconfig}, command="run-dra")


def documents(config: str, gpus: str) -> tuple[list[dict[str, Any]], int]:
    """Our DeviceClasses for `config` on that node (as `plan --format dra` prints them), and
    how many devices its pool holds."""
    cfg = parse_config(config, file="config.yaml").config
    node_plan = plan_node(cfg, discover(backend_from_spec(gpus)), as_is=True)
    docs = dra_documents(cfg, node_plan, NODE, DRIVER, api_version=V1BETA1)
    devices = sum(len(d["spec"]["devices"]) for d in docs if d["kind"] == "ResourceSlice")
    return [d for d in docs if d["kind"] == "DeviceClass"], devices


async def create_pod(
    real: RealDra, name: str, class_name: str, *, count: int = 1, selector: str | None = None
) -> None:
    request: dict[str, Any] = {
        "deviceClassName": class_name,
        # The harness's API server does no defaulting: what kube-apiserver would fill in.
        "allocationMode": "ExactCount",
        "count": count,
    }
    if selector is not None:
        request["selectors"] = [{"cel": {"expression": selector}}]
    await real.claim_for_pod(name, request, node=NODE, version="v1beta1")


def pod(name: str) -> dict[str, str]:
    return {"namespace": "default", "name": name}


async def test_real_allocator_and_kubelet_prepare_our_devices(
    real: RealDra, short_dir: Path
) -> None:
    gpus = "simulated:t4x4"
    async with plugin(real, short_dir, SHARED_CONFIG, gpus) as first:
        registered = await real.ok({"cmd": "wait-plugin", "driver": DRIVER, "timeout": 15})
        assert registered["registered"] is True
        (pool,) = await real.wait_slices(8)
        assert pool["spec"]["pool"]["name"] == NODE
        assert pool["spec"]["pool"]["resourceSliceCount"] == 1
        assert all("basic" in d for d in pool["spec"]["devices"])  # 1.32 speaks v1beta1
        device_classes, count = documents(SHARED_CONFIG, gpus)
        assert count == 8
        for device_class in device_classes:
            await real.ok({"cmd": "create", "object": device_class})
        await create_pod(real, "p", "gpu.shared.gpu.sharing-plugin.io", count=2)

        allocated = await real.ok({"cmd": "allocate", "pod": pod("p")})
        (claim,) = allocated["claims"]
        results = claim["allocation"]["devices"]["results"]
        assert [(r["driver"], r["pool"]) for r in results] == [(DRIVER, NODE)] * 2
        names = [r["device"] for r in results]
        uid = claim["uid"]

        prepared = await real.ok({"cmd": "prepare", "pod": pod("p")})
        (container,) = prepared["containers"]
        assert container["cdiDevices"] == [f"{DRIVER}/claim={uid}-{n}" for n in names]
        spec_file = short_dir / "cdi" / f"{DRIVER}-claim_{uid}.json"
        spec = json.loads(spec_file.read_text())
        assert spec["kind"] == f"{DRIVER}/claim"
        assert [d["name"] for d in spec["devices"]] == [f"{uid}-{n}" for n in names]
        uuids = {
            d["name"]: d["basic"]["attributes"]["uuid"]["string"] for d in pool["spec"]["devices"]
        }
        visible = ",".join(dict.fromkeys(uuids[n] for n in names))
        for device in spec["devices"]:
            assert device["containerEdits"]["env"] == [f"NVIDIA_VISIBLE_DEVICES={visible}"]

        # The plugin dies; a new one must unprepare what the first prepared (its checkpoint).
        first.process.kill()
        await first.wait(5)
    async with plugin(real, short_dir, SHARED_CONFIG, gpus) as second:
        # The kubelet still holds the dead plugin's registration: wait for the new one.
        await real.wait_registrations(2)
        await real.wait_slices(8)
        await real.ok({"cmd": "unprepare", "pod": pod("p")})
        assert not spec_file.exists()
        checkpoint = (await real.ok({"cmd": "checkpoint"}))["checkpoint"]
        assert '"ClaimInfoStateList":[]' in checkpoint["Data"]

        assert await second.stop(timeout=2.0) == 0  # docs/contract.md: within 2 s
    # Deregistered twice: the killed plugin's stale socket removed, then ours at exit.
    events = await real.wait_registrations(2, "DeRegisterPlugin")
    assert events[-1]["call"] == "DeRegisterPlugin"
    # The health service listed beside them does not trouble a 1.32 kubelet (which does not
    # watch health unless ResourceHealthStatus is on).
    services = {tuple(e["versions"]) for e in events if e["call"] == "RegisterPlugin"}
    assert services == {("v1.DRAPlugin", "v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth")}


async def test_real_cel_selects_a_mig_profile_from_our_attributes(
    real: RealDra, short_dir: Path
) -> None:
    gpus = "simulated:a100-mig-mixed"
    async with plugin(real, short_dir, MIG_CONFIG, gpus) as running:
        await real.ok({"cmd": "wait-plugin", "driver": DRIVER, "timeout": 15})
        wanted, count = documents(MIG_CONFIG, gpus)
        found = await real.wait_slices(count)
        profiles = sorted(
            {
                d["basic"]["attributes"]["migProfile"]["string"]
                for s in found
                for d in s["spec"]["devices"]
                if "migProfile" in d["basic"]["attributes"]
            }
        )
        profile = profiles[0]
        # Any MIG device of that profile, whatever its resource: a selector on our attribute.
        mig_class = f"mig-{profile.replace('+', '.')}.gpu.sharing-plugin.io"
        for device_class in wanted:
            await real.ok({"cmd": "create", "object": device_class})
        selector = f'device.attributes["{DRIVER}"].migProfile == "{profile}"'
        await create_pod(real, "m", mig_class, selector=selector)
        (claim,) = (await real.ok({"cmd": "allocate", "pod": pod("m")}))["claims"]
        (result,) = claim["allocation"]["devices"]["results"]
        assert result["device"].startswith("mig-")
        prepared = await real.ok({"cmd": "prepare", "pod": pod("m")})
        (container,) = prepared["containers"]
        assert container["cdiDevices"] == [f"{DRIVER}/claim={claim['uid']}-{result['device']}"]
        spec = json.loads((short_dir / "cdi" / f"{DRIVER}-claim_{claim['uid']}.json").read_text())
        (device,) = spec["devices"]
        assert device["containerEdits"]["env"][0].startswith("NVIDIA_VISIBLE_DEVICES=MIG-")
        assert await running.stop(timeout=2.0) == 0
