"""Fixtures for end-to-end tests: the real `sharing-plugin run` process against the simulator."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from sharing_plugin.sim.kubelet.simulator import KubeletSimulator


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A fresh directory under /tmp: pytest's tmp_path is too long for AF_UNIX socket paths
    (108 bytes), so the kubelet dir and its sockets live here."""
    path = Path(tempfile.mkdtemp(prefix="e", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def kubelet(short_dir: Path) -> AsyncIterator[KubeletSimulator]:
    """The in-package kubelet simulator, serving in this test's event loop."""
    async with KubeletSimulator(short_dir, grace_period=0.2, dial_timeout=2.0) as sim:
        yield sim
