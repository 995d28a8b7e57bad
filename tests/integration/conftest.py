"""Fixtures for integration tests: short socket directories, a kubelet simulator, GPU nodes."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import node_file
from mps_harness import TWO_GPUS, reap_daemons
from support.mps import write_wrapper

from sharing_plugin.backends import backend_from_spec
from sharing_plugin.config.model import Config
from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.nvml import discover as nvml
from sharing_plugin.plan import Plan, plan
from sharing_plugin.sim.kubelet.simulator import KubeletSimulator


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A fresh directory under /tmp: pytest's tmp_path is too long for AF_UNIX socket paths
    (108 bytes), so socket tests keep their paths well under 100 bytes here."""
    path = Path(tempfile.mkdtemp(prefix="k", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def kubelet_sim(short_dir: Path) -> AsyncIterator[KubeletSimulator]:
    """A running kubelet simulator with short timeouts, so failure paths stay fast."""
    async with KubeletSimulator(short_dir, grace_period=0.2, dial_timeout=2.0) as sim:
        yield sim


_INVENTORIES: dict[str, Inventory] = {}


def node(preset: str) -> Inventory:
    """The inventory of a simulated preset node, discovered through the NVML adapter once."""
    if preset not in _INVENTORIES:
        _INVENTORIES[preset] = nvml.discover(backend_from_spec(f"simulated:{preset}"))
    return _INVENTORIES[preset]


@pytest.fixture
def make_plan() -> Callable[..., tuple[Plan, Config, Inventory]]:
    """make_plan(config_dict, preset="dgx-a100-80gb") -> (plan, config, inventory)."""

    def build(
        config: dict[str, Any], preset: str = "dgx-a100-80gb"
    ) -> tuple[Plan, Config, Inventory]:
        cfg = Config.model_validate({"version": "v1", **config})
        inventory = node(preset)
        return plan(cfg, inventory), cfg, inventory

    return build


@pytest.fixture
def binary(short_dir: Path) -> Iterator[Path]:
    """The stand-in MPS control binary (the MPS tests), its daemons reaped after the test."""
    yield write_wrapper(short_dir / "bin")
    reap_daemons(short_dir)


@pytest.fixture
def gpus(short_dir: Path) -> str:
    """A simulated node of two GPUs."""
    return f"simulated:{node_file(short_dir, TWO_GPUS)}"
