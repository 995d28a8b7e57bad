"""Two `run-dra` instances on one node at once, as a DaemonSet rolling update with `maxSurge: 1,
maxUnavailable: 0` runs them, against the kubelet's 1.36 plugin manager and DRA manager
(`realdra136`; its README in ../shared/tools). Skipped where the tools are absent.

What the real kubelet shows: each instance registers under its own socket names, the kubelet
keeps both and calls the newest; a claim prepared through the old instance is unprepared
through the new one (the checkpoint and spec files are shared); the old one leaving
deregisters only itself: the pool stays published and the new one serves every call.
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

from sharing_plugin.dra.checkpoint import Checkpoint, checkpoint_path

DRIVER = realdra.DRIVER
NODE = "node-1"
GPUS = "simulated:t4x4"
SHARED_CLASS = "gpu.shared.gpu.sharing-plugin.io"
CONFIG = (
    "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n"
    "      - name: gpu\n        replicas: 4\n"
)

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


def plugin(real: RealDra, root: Path) -> PluginProcess:
    path = root / "config.yaml"
    path.write_text(CONFIG)
    args = ["--config", str(path), "--gpus", GPUS, "--kubelet-dir", str(root)]
    args += ["--node-name", NODE, "--cdi-dir", str(root / "cdi"), "--metrics-address", "off"]
    args += ["--clear-slices-on-exit", "on"]  # the old one leaving must not clear them anyway
    return PluginProcess(args, {"KUBECONFIG": real.kubeconfig}, command="run-dra")


async def claim(real: RealDra, name: str) -> str:
    """A pod with a claim of one share of any GPU, allocated; the claim's UID."""
    await real.claim_for_pod(name, {"deviceClassName": SHARED_CLASS}, node=NODE)
    (allocated,) = (await real.ok({"cmd": "allocate", "pod": pod(name)}))["claims"]
    return str(allocated["uid"])


def pod(name: str) -> dict[str, str]:
    return {"namespace": "default", "name": name}


def spec_file(root: Path, uid: str) -> Path:
    return root / "cdi" / f"{DRIVER}-claim_{uid}.json"


def sockets(root: Path) -> set[str]:
    return {p.name for p in (root / "plugins_registry").iterdir()} | {
        p.name for p in (root / "plugins" / DRIVER).glob("*.sock")
    }


async def registered(real: RealDra, count: int) -> list[dict[str, Any]]:
    return await real.wait_registrations(count, within=15)


async def test_two_instances_overlap_and_the_old_one_leaves_without_a_gap(
    real: RealDra, short_dir: Path
) -> None:
    async with plugin(real, short_dir) as old:
        await real.ok({"cmd": "wait-plugin", "driver": DRIVER, "timeout": 15})
        await real.create(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": SHARED_CLASS},
                "spec": {
                    "selectors": [
                        {
                            "cel": {
                                "expression": f'device.driver == "{DRIVER}" && device.attributes'
                                f'["{DRIVER}"].resource == "nvidia.com/gpu.shared"'
                            }
                        }
                    ]
                },
            }
        )
        await real.wait_slices(4)
        first = await claim(real, "first")
        await real.ok({"cmd": "prepare", "pod": pod("first")})
        old_sockets = sockets(short_dir)
        assert len(old_sockets) == 2

        async with plugin(real, short_dir) as new:
            await registered(real, 2)  # the kubelet registered the second instance too
            both = sockets(short_dir)
            assert len(both) == 4 and old_sockets < both
            second = await claim(real, "second")
            third = await claim(real, "third")
            # Prepares and unprepares while both serve, whichever the kubelet asks.
            await real.ok({"cmd": "prepare", "pod": pod("second")})
            await real.ok({"cmd": "prepare", "pod": pod("third")})
            await real.ok({"cmd": "unprepare", "pod": pod("third")})
            assert not spec_file(short_dir, third).exists()

            assert await old.stop() == 0
            assert sockets(short_dir) == both - old_sockets  # only its own sockets went
            events = await real.wait_registrations(1, call="DeRegisterPlugin", within=15)
            assert [e["call"] for e in events].count("DeRegisterPlugin") == 1, events
            # The old one leaving cleared nothing: the pool stays and the new one serves it.
            assert len(await real.wait_slices(4)) >= 1
            await real.ok({"cmd": "unprepare", "pod": pod("first")})  # prepared by the old one
            assert not spec_file(short_dir, first).exists()
            fourth = await claim(real, "fourth")
            await real.ok({"cmd": "prepare", "pod": pod("fourth")})
            held = Checkpoint(checkpoint_path(short_dir, DRIVER)).load()
            assert set(held) == {second, fourth}
            for uid in (second, fourth):
                assert json.loads(spec_file(short_dir, uid).read_text())["devices"]
            assert await new.stop() == 0
        assert not sockets(short_dir)
