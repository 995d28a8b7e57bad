"""What the one node pipeline gives every serving command alike, where the copies had drifted.

- A rejected config's `lastError` stays in /status through Node updates and API trouble (a
  broken edit must never look accepted): `run-dra` used to clear it on every Node it saw.
- GPUs found after a start without them (the driver loading after the plugin) are served:
  `run-dra` and `mps-control` used to keep the empty inventory until restarted. `run-dra` is
  run here as a process against the fake API server; `run` and `mps-control` are in
  tests/e2e/test_driver_loads_later.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml_fast
from daemon_harness import eventually, running
from dra_harness import NODE, dra_running
from kube_api import FakeKubeApi
from plugin_process import PluginProcess
from support.dra.kubelet import DraKubeletSimulator
from support.observe import next_rejected

from sharing_plugin.daemon.node.outcome import Rejected
from sharing_plugin.sources.kube import client_from_kubeconfig

SHARED = (
    "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n"
    "      - name: gpu\n        replicas: 2\n"
)
BROKEN = SHARED.replace("replicas: 2", "replicas: 0")


@asynccontextmanager
async def run_with_api(root: Path, config: str) -> AsyncIterator[tuple[FakeKubeApi, Any]]:
    async with FakeKubeApi() as api:
        api.put_node(NODE, {})
        client = client_from_kubeconfig(api.kubeconfig(root / "kubeconfig"))
        try:
            async with running(root, config, node_name=NODE, kube_client=client) as run:
                yield api, run
        finally:
            await client.close()


@asynccontextmanager
async def run_dra(root: Path, config: str) -> AsyncIterator[tuple[FakeKubeApi, Any]]:
    async with dra_running(root, config) as run:
        yield run.api, run


Started = Callable[[Path, str], AbstractAsyncContextManager[tuple[FakeKubeApi, Any]]]


def node_watches(api: FakeKubeApi) -> int:
    """How many watch requests on Nodes the fake API server has had."""
    return sum(
        1 for r in api.requests if "/nodes" in r.path and r.query.get("watch") in ("true", "1")
    )


async def new_node_watch(api: FakeKubeApi, end: Callable[[], None]) -> None:
    """End the Node watch (`end`) and wait for the next one to be open: by then the plugin has
    taken in everything the old one carried, and read the Node again if it had to."""
    await api.wait_watches(1)
    before = node_watches(api)
    end()
    await eventually(lambda: node_watches(api) > before and api.open_watches == 1)


@pytest.mark.parametrize("started", [run_with_api, run_dra], ids=["run", "run-dra"])
async def test_a_rejected_configs_error_stays_through_node_updates_and_api_trouble(
    short_dir: Path, started: Started
) -> None:
    async with started(short_dir, SHARED) as (api, run):
        with run.daemon.pipeline.outcomes() as outcomes:
            run.write(BROKEN)
            rejected = await next_rejected(outcomes)
        assert isinstance(rejected, Rejected)
        error = run.daemon.status.last_error
        assert error is not None and "replicas: must be >= 1 (got 0)" in error

        # Another controller labels the node: the plugin sees a new Node, nothing more.
        api.set_node_label(NODE, "example.com/rack", "r12")
        await new_node_watch(api, api.close_watches)
        assert run.daemon.status.last_error == error

        # The connection drops: API trouble shows while it lasts, then the config's error again.
        await new_node_watch(api, lambda: api.close_watches(clean=False))
        assert run.daemon.status.last_error == error


@pytest.mark.subprocess
async def test_run_dra_publishes_the_gpus_once_the_driver_answers(short_dir: Path) -> None:
    node = short_dir / "node.yaml"
    node.write_text(yaml_fast.dump({"gpus": [{"product": "Tesla T4", "count": 2}]}))
    node.write_text(node.read_text() + "driverLoaded: false\n")
    config = short_dir / "config.yaml"
    config.write_text(SHARED + "flags:\n  failOnInitError: false\n")
    async with FakeKubeApi() as api:
        api.put_node(NODE, {})
        kubeconfig = api.kubeconfig(short_dir / "kubeconfig")
        args = ["--config", str(config), "--gpus", f"simulated:{node}", "--node-name", NODE]
        args += ["--kubelet-dir", str(short_dir), "--cdi-dir", str(short_dir / "cdi")]
        args += ["--metrics-address", "off"]

        def devices() -> int:
            return sum(len(s["spec"]["devices"]) for s in api.dra_objects("resourceslices"))

        env = {"KUBECONFIG": str(kubeconfig)}
        kubelet = DraKubeletSimulator(short_dir)  # slices are published once it registered us
        async with kubelet, PluginProcess(args, env, command="run-dra") as plugin:
            await plugin.wait_for_line("NVML_ERROR_DRIVER_NOT_LOADED")
            await plugin.wait_for_line("applied (start, generation 1): 0 DRA device(s)")
            assert devices() == 0
            node.write_text(node.read_text().replace("driverLoaded: false", "driverLoaded: true"))
            await eventually(lambda: devices() == 2, within=10)  # the two GPUs, by capacity
            assert await plugin.stop() == 0
