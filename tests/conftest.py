"""Fixtures shared by every test folder."""

from __future__ import annotations

import asyncio
import gc
import inspect
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
import realapi
import realcluster
from kustomize_render import SHARED_DIR_ENV


def pytest_configure(config: pytest.Config) -> None:
    """The directory the test processes of this run share (made before pytest-xdist starts its
    workers, which inherit the variable), and in it what the shared real API server and real
    cluster need."""
    sys.addaudithook(_audit)
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


# --- markers: what a test needs beyond this interpreter ---------------------------------------
# Each process a test starts (in its setup, body or teardown) is seen through the interpreter's
# audit hook, which every way of starting one raises (subprocess, asyncio, os.exec*, fork), and
# must be declared by a marker: a test that starts kubectl is marked `kubectl`, one that starts
# a binary of ../shared/tools `realtools`, any other `subprocess`. A marker declared and not
# used is not checked: a render another test made first, a server another test started, are
# still the marked test's needs.

_SPAWNS = frozenset(
    {
        "subprocess.Popen",
        "os.posix_spawn",
        "os.exec",
        "os.spawn",
        "os.system",
        "os.fork",
        "os.forkpty",
    }
)
_REAL_TOOLS = frozenset({"realapi", "realkubelet", "realdra", "realdra136", "realcluster"})
_started: list[str] | None = None  # programs the running test started, while one runs


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _started is None or event not in _SPAWNS:
        return
    if event == "subprocess.Popen":
        executable, argv = args[0], args[1]
        argv = [argv] if isinstance(argv, (str, bytes)) else list(argv)
        program = executable or argv[0]
        if os.path.basename(os.fsdecode(program)) in ("sh", "bash"):  # `sh -c 'exec "$@"' TOOL`
            _started.extend(os.path.basename(os.fsdecode(a)) for a in argv[1:])
    elif event in ("os.posix_spawn", "os.exec"):
        program = args[0]
    elif event == "os.spawn":
        program = args[1]
    else:
        program = event
    _started.append(os.path.basename(os.fsdecode(program)))


def _needs(program: str) -> str:
    if program == "kubectl":
        return "kubectl"
    return "realtools" if program in _REAL_TOOLS else "subprocess"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    unmarked = []
    for item in items:  # kubectl and a real tool are child processes too
        if item.get_closest_marker("subprocess") is None and (
            item.get_closest_marker("kubectl") or item.get_closest_marker("realtools")
        ):
            item.add_marker("subprocess")
        # The shared server is started by one test only: every user is declared, not just it.
        uses = {"real_api", "real_api_alone"} & set(getattr(item, "fixturenames", ()))
        if uses and item.get_closest_marker("realtools") is None:
            unmarked.append(item.nodeid)
    if unmarked:
        raise pytest.UsageError(f"uses the real API server, not marked realtools: {unmarked}")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    global _started
    _started = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if call.when == "teardown":
        global _started
        started, _started = _started or [], None
        needed = {_needs(p) for p in started}
        missing = sorted(m for m in needed if item.get_closest_marker(m) is None)
        if missing and report.passed:
            report.outcome = "failed"
            report.longrepr = (
                f"{item.nodeid} started {sorted(set(started))} but is not marked "
                f"{', '.join(missing)}: mark it (pytest.mark.<name>), see CONTRIBUTING.md"
            )
    return report


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


# Modules on the run's second cluster: about half of the real-cluster tests' time.
_SECOND_CLUSTER = frozenset(
    {
        "test_realcluster_run.py",
        "test_realcluster_mig_mps.py",
        "test_realcluster_memory_limits.py",
        "test_realcluster_run_rolling.py",
        "test_realcluster_run_dra_rolling.py",
    }
)


def _cluster_of_file(name: str) -> str | None:
    if not name.startswith("test_realcluster_"):
        return None
    first, second = realcluster.CLUSTERS
    return second if name in _SECOND_CLUSTER else first


def _cluster_of(item: pytest.Item) -> str:
    cluster = _cluster_of_file(item.path.name)
    assert cluster is not None, f"{item.nodeid} uses real_cluster: name it test_realcluster_*.py"
    return cluster


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """A real cluster serves one test at a time: each cluster's tests go to one worker together,
    which starts on them while the others run the rest, instead of workers waiting on each
    other's turn. pytest-xdist's own `--dist loadgroup` cannot do it under pytest 9 (it marks a
    group by rewriting `item._nodeid`, which pytest 9 no longer reads): the groups are made
    here, on the controller, from the test file's name."""
    from xdist.scheduler import LoadScopeScheduling

    class ByCluster(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _cluster_of_file(nodeid.split("::")[0].rsplit("/", 1)[-1]) or nodeid

    return ByCluster(config, log)


@pytest.fixture
def real_cluster(request: pytest.FixtureRequest) -> Iterator[realcluster.RealCluster]:
    """The run's real one-node cluster (tests/realcluster.py), this test's alone while it runs:
    leave its node as you found it (tests/realcluster_support.py `on_node` does). Skipped where
    ../shared/tools is absent."""
    if not realcluster.AVAILABLE:
        pytest.skip(realcluster.SKIP_REASON)
    with realcluster.held(_cluster_of(request.node)) as cluster:
        yield cluster
