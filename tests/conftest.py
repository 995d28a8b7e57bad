"""Fixtures shared by every test folder."""

from __future__ import annotations

import asyncio
import gc
import inspect
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import realapi
import realcluster
from kustomize_render import SHARED_DIR_ENV


def pytest_configure(config: pytest.Config) -> None:
    """The directory the test processes of this run share (made before pytest-xdist starts its
    workers, which inherit the variable), and in it what the shared real API server and real
    cluster need."""
    if SHARED_DIR_ENV not in os.environ:
        os.environ[SHARED_DIR_ENV] = tempfile.mkdtemp(prefix="sharing-plugin-tests-")
        config.stash[_made_shared_dir] = os.environ[SHARED_DIR_ENV]
        if realapi.AVAILABLE:
            realapi.configure(Path(os.environ[SHARED_DIR_ENV]))
        if realcluster.AVAILABLE:
            realcluster.configure(Path(os.environ[SHARED_DIR_ENV]))


def pytest_unconfigure(config: pytest.Config) -> None:
    made = config.stash.get(_made_shared_dir, None)
    if made is not None:
        if realapi.AVAILABLE:
            realapi.unconfigure(Path(made))  # after the workers: nobody uses the server now
        if realcluster.AVAILABLE:
            realcluster.unconfigure(Path(made))
        shutil.rmtree(made, ignore_errors=True)
        del os.environ[SHARED_DIR_ENV]
    # Python's last garbage collection at exit walks every object a test process made (~0.7 s
    # for a worker, which the run waits for): what is alive now is left to the exit instead.
    gc.freeze()


_made_shared_dir = pytest.StashKey[str]()


@pytest.fixture(autouse=True)
def _no_leftover_tasks(request: pytest.FixtureRequest) -> None:
    """Fail a coroutine test that leaves asyncio tasks running behind it. A plain test has no
    event loop, and giving it one only for this check cost ~2 ms of CPU a test."""
    if inspect.iscoroutinefunction(request.function):
        request.getfixturevalue("_no_leftover_tasks_in_its_loop")


@pytest.fixture
async def _no_leftover_tasks_in_its_loop() -> AsyncIterator[None]:
    before = set(asyncio.all_tasks())
    yield
    current = asyncio.current_task()
    left = [t for t in asyncio.all_tasks() - before if t is not current and not t.done()]
    if left:
        # grpc.aio finishes a closed call's status handling a few loop turns later; a task
        # that ends on its own within a moment is not one left running.
        _, pending = await asyncio.wait(left, timeout=1.0)
        left = list(pending)
    if left:
        for task in left:
            task.cancel()
        names = [t.get_name() for t in left]
        pytest.fail(f"test left {len(left)} asyncio task(s) running: {names}")


@pytest.fixture
def real_api() -> Iterator[realapi.RealApi]:
    """The run's real kube-apiserver (tests/realapi.py), shared with other tests: use names of
    your own (`realapi.unique`). Skipped where ../shared/tools is absent."""
    if not realapi.AVAILABLE:
        pytest.skip(realapi.SKIP_REASON)
    with realapi.shared() as api:
        yield api


@pytest.fixture
def real_api_alone() -> Iterator[realapi.RealApi]:
    """The run's real kube-apiserver held alone: no other test uses it meanwhile, so this one
    may restart it (`realapi.restart`)."""
    if not realapi.AVAILABLE:
        pytest.skip(realapi.SKIP_REASON)
    with realapi.exclusive() as api:
        yield api


@pytest.fixture
def real_cluster() -> Iterator[realcluster.RealCluster]:
    """The run's real one-node cluster (tests/realcluster.py), this test's alone while it runs:
    leave its node as you found it (tests/realcluster_support.py `on_node` does). Skipped where
    ../shared/tools is absent."""
    if not realcluster.AVAILABLE:
        pytest.skip(realcluster.SKIP_REASON)
    with realcluster.held() as cluster:
        yield cluster
