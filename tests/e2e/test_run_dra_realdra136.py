"""`sharing-plugin run-dra` against real Kubernetes 1.36 code (`realdra136`: the structured
allocator with consumable capacity on, the kubelet's 1.36 DRA manager; its README in
../shared/tools). Skipped where the tools are absent (a user's clone); CI has them.

What only the real code proves about shared GPUs published by capacity: the allocator reads our
request policy as we mean it (a claim that asks nothing takes one replica's share, a larger
request is rounded to whole shares, the memory is never given twice), the kubelet takes our
dra/v1 answer with the share ID into its checkpoint, and an MPS claim's CDI edits carry the
limits of what the scheduler granted. Other 1.36 features (dynamic MIG, taints) have their own
tests beside this one.
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
from sharing_plugin.dra.checkpoint import checkpoint_path
from sharing_plugin.nvml.discover import discover
from sharing_plugin.plan.node import plan_node
from sharing_plugin.views.dra import dra_documents

DRIVER = realdra.DRIVER
NODE = "node-1"
GPUS = "simulated:t4x4"  # 4 x Tesla T4, 15360 MiB each
SHARED_CLASS = "gpu.shared.gpu.sharing-plugin.io"

pytestmark = [
    pytest.mark.skipif(
        not realdra.available("realdra136"), reason=realdra.skip_reason("realdra136")
    ),
    pytest.mark.realtools,
]


def sliced(kind: str, replicas: int) -> str:
    return (
        f"version: v1\nsharing:\n  {kind}:\n    renameByDefault: true\n    resources:\n"
        f"      - name: gpu\n        replicas: {replicas}\n"
    )


@pytest.fixture
async def real(short_dir: Path) -> AsyncIterator[RealDra]:
    async with realdra.running("realdra136", short_dir, node=NODE) as dra:
        yield dra


def plugin(real: RealDra, root: Path, config: str) -> PluginProcess:
    path = root / "config.yaml"
    path.write_text(config)
    args = ["--config", str(path), "--gpus", GPUS, "--kubelet-dir", str(root)]
    args += ["--node-name", NODE, "--cdi-dir", str(root / "cdi"), "--metrics-address", "off"]
    return PluginProcess(args, {"KUBECONFIG": real.kubeconfig}, command="run-dra")


async def started(real: RealDra, config: str) -> list[dict[str, Any]]:
    """Once the kubelet registered the plugin and the pool is published: our DeviceClasses
    created (as `plan --format dra` prints them) and the pool's devices."""
    await real.ok({"cmd": "wait-plugin", "driver": DRIVER, "timeout": 15})
    cfg = parse_config(config, file="config.yaml").config
    node_plan = plan_node(cfg, discover(backend_from_spec(GPUS)), as_is=True)
    docs = dra_documents(cfg, node_plan, NODE, DRIVER)
    devices = [d for s in docs if s["kind"] == "ResourceSlice" for d in s["spec"]["devices"]]
    for document in docs:
        if document["kind"] == "DeviceClass":
            await real.create(document)
    found = await real.wait_slices(len(devices))
    return [d for s in found for d in s["spec"]["devices"]]


async def claim_pod(real: RealDra, name: str, *, memory: str | None = None) -> None:
    """A pod with a claim of one share of GPU 0 (`memory`: what it asks; None: the default)."""
    exactly: dict[str, Any] = {
        "deviceClassName": SHARED_CLASS,
        "selectors": [{"cel": {"expression": f'device.attributes["{DRIVER}"].index == 0'}}],
    }
    if memory is not None:
        exactly["capacity"] = {"requests": {"memory": memory}}
    await real.claim_for_pod(name, exactly, node=NODE)


def pod(name: str) -> dict[str, str]:
    return {"namespace": "default", "name": name}


async def allocated(real: RealDra, name: str) -> dict[str, Any]:
    (claim,) = (await real.ok({"cmd": "allocate", "pod": pod(name)}))["claims"]
    (result,) = claim["allocation"]["devices"]["results"]
    return {"uid": claim["uid"], **result}


def spec_of(root: Path, uid: str) -> dict[str, Any]:
    spec: dict[str, Any] = json.loads((root / "cdi" / f"{DRIVER}-claim_{uid}.json").read_text())
    return spec


async def test_claims_share_a_gpu_by_memory_and_one_too_many_is_refused(
    real: RealDra, short_dir: Path
) -> None:
    config = sliced("timeSlicing", 4)
    async with plugin(real, short_dir, config) as first:
        devices = await started(real, config)
        assert len(devices) == 4  # one device per GPU, not one per replica
        assert all(d["allowMultipleAllocations"] for d in devices)
        await claim_pod(real, "small")  # asks nothing: one replica's share
        await claim_pod(real, "large", memory="5Gi")  # rounded up to two shares
        await claim_pod(real, "more", memory="7680Mi")  # would need 19200 of 15360 MiB
        small, large = await allocated(real, "small"), await allocated(real, "large")
        assert small["device"] == large["device"]
        assert small["consumedCapacity"] == {"memory": "3840Mi"}
        assert large["consumedCapacity"] == {"memory": "7680Mi"}
        assert small["shareID"] != large["shareID"]
        refused = await real.cmd({"cmd": "allocate", "pod": pod("more")})
        assert refused["ok"] is False and "cannot allocate" in refused["error"]

        prepared = await real.ok({"cmd": "prepare", "pod": pod("small")})
        (container,) = prepared["containers"]
        assert container["cdiDevices"] == [f"{DRIVER}/claim={small['uid']}-{small['device']}"]
        (device,) = spec_of(short_dir, small["uid"])["devices"]
        gpu0 = discover(backend_from_spec(GPUS)).gpus[0].uuid
        assert device["containerEdits"]["env"] == [f"NVIDIA_VISIBLE_DEVICES={gpu0}"]
        # The kubelet keeps the share ID our dra/v1 answer gave (v1beta1 has no field for it).
        checkpoint = (await real.ok({"cmd": "checkpoint"}))["checkpoint"]["Data"]
        assert small["shareID"] in checkpoint

        # A new plugin after kill -9: the prepared share is still prepared, then unprepared.
        first.process.kill()
        await first.wait(5)
    async with plugin(real, short_dir, config) as second:
        await real.wait_registrations(2)
        await real.wait_slices(4)
        await real.ok({"cmd": "unprepare", "pod": pod("small")})
        assert not (short_dir / "cdi" / f"{DRIVER}-claim_{small['uid']}.json").exists()
        checkpoint = (await real.ok({"cmd": "checkpoint"}))["checkpoint"]["Data"]
        assert '"ClaimInfoStateList":[]' in checkpoint
        assert await second.stop() == 0


async def test_an_mps_claim_gets_the_limits_of_what_the_scheduler_granted(
    real: RealDra, short_dir: Path
) -> None:
    config = sliced("mps", 4)
    async with plugin(real, short_dir, config) as running:
        devices = await started(real, config)
        assert {d["attributes"]["sharing"]["string"] for d in devices} == {"mps"}
        await claim_pod(real, "default-share")
        await claim_pod(real, "half", memory="7680Mi")
        for name, pinned, threads in (("default-share", 3840, 25), ("half", 7680, 50)):
            result = await allocated(real, name)
            await real.ok({"cmd": "prepare", "pod": pod(name)})
            (device,) = spec_of(short_dir, result["uid"])["devices"]
            env = device["containerEdits"]["env"]
            assert f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={pinned}M" in env
            assert f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={threads}" in env
            assert any(e.startswith("CUDA_MPS_PIPE_DIRECTORY=") for e in env)
        # Our checkpoint keeps what each share consumed and asked, as the real allocator wrote
        # and the real API server kept them; a replicas edit counts the claims at that memory:
        # 11520 of 15360 MiB held, one 3072 MiB share of 5 replicas fits.
        kept = json.loads(checkpoint_path(short_dir, DRIVER).read_text())
        shares = sorted(
            (d["consumedMiB"], d.get("askedMiB")) for c in kept["claims"] for d in c["devices"]
        )
        assert shares == [(3840, None), (7680, 7680)], shares
        updated = short_dir / "config.tmp"
        updated.write_text(sliced("mps", 5))
        updated.replace(short_dir / "config.yaml")
        line = await running.wait_for_line("the config's share takes full effect as claims go")
        assert "2 claim share(s) placed at another share size hold 11520 MiB in all" in line
        assert "1 of the 5 shares of 3072 MiB fit now" in line
        assert await running.stop() == 0
