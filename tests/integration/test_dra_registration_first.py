"""`run-dra` publishes its ResourceSlices only once the kubelet confirmed its registration: the
scheduler places pods on whatever is published, and a real kubelet fails the prepare of a driver
it has not registered yet ("DRA driver ... is not registered"), retrying only at its 60-90 s
resync. The plugin used to publish ~10 ms after offering its registration socket, while a real
kubelet registers it at its next check, 0.2-0.7 s later (tests/e2e/test_realcluster_run_dra.py
shows a pod placed then waiting). Here: the process against the fake API server, and the
kubelet's plugin watcher (the DRA kubelet simulator) started only after a while, or refusing.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from dra_harness import NODE
from kube_api import FakeKubeApi
from plugin_process import PluginProcess
from support.dra.kubelet import DraKubeletSimulator

pytestmark = pytest.mark.subprocess  # starts the plugin or a stand-in as a process

CONFIG = "version: v1\n"
GPUS = "simulated:t4x4"


def run_dra(short_dir: Path, api: FakeKubeApi) -> tuple[list[str], dict[str, str]]:
    """`run-dra`'s arguments and environment on the fake API's node, in `short_dir`."""
    config = short_dir / "config.yaml"
    config.write_text(CONFIG)
    api.put_node(NODE, {})
    args = ["--config", str(config), "--gpus", GPUS, "--node-name", NODE]
    args += ["--kubelet-dir", str(short_dir), "--cdi-dir", str(short_dir / "cdi")]
    args += ["--metrics-address", "off"]
    return args, {"KUBECONFIG": str(api.kubeconfig(short_dir / "kubeconfig"))}


async def test_slices_wait_for_the_kubelet_to_register_the_driver(short_dir: Path) -> None:
    async with FakeKubeApi() as api:
        args, env = run_dra(short_dir, api)

        def devices() -> int:
            return sum(len(s["spec"]["devices"]) for s in api.dra_objects("resourceslices"))

        async with PluginProcess(args, env, command="run-dra") as plugin:
            await plugin.wait_for_line("registration offered")
            await asyncio.sleep(0.5)  # what a real kubelet may take to notice the socket
            assert devices() == 0, plugin.stderr()
            async with DraKubeletSimulator(short_dir) as kubelet:
                await kubelet.wait_plugin("gpu.sharing-plugin.io")
                await plugin.wait_for_line("registered with the kubelet")
                async with asyncio.timeout(5):
                    while devices() != 4:  # noqa: ASYNC110 -- another process's writes
                        await asyncio.sleep(0.02)
                assert await plugin.stop() == 0, plugin.stderr()


async def test_a_kubelet_that_refuses_the_driver_gets_no_slices(short_dir: Path) -> None:
    async with FakeKubeApi() as api:
        args, env = run_dra(short_dir, api)
        # A kubelet knowing none of the DRA services the plugin serves refuses it.
        kubelet = DraKubeletSimulator(short_dir, services=("v0.unknown.DRAPlugin",))
        async with kubelet, PluginProcess(args, env, command="run-dra") as plugin:
            await plugin.wait_for_line("the kubelet refused DRA driver")
            await asyncio.sleep(0.3)
            assert api.dra_objects("resourceslices") == [], plugin.stderr()
            assert await plugin.stop() == 0, plugin.stderr()
