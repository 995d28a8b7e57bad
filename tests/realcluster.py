"""A real one-node Kubernetes 1.36 cluster (`../shared/tools/realcluster.gz`: etcd, API server,
scheduler, controller-manager and a real kubelet in one process; its README there), started once
per test run and shared by every test process of it.

The cluster takes 8-18 s and ~350 MiB to start, so the first test that needs it starts it and
later ones use it: pytest-xdist's workers find it through the run's shared directory (made by
tests/conftest.py). It has one node, and a test runs the plugin on that node: one test at a time
holds the cluster (`held`), waiting for the one before it. Each test uses its own namespaces and
leaves the node as it found it: no pod of its own left, its plugin stopped (`clean_node`). As
with tests/realapi.py the cluster is nobody's child in the run, and reads stdin from a FIFO only
the run's main process holds open: it stops when the run ends, however that ends.

Its state lives in a short directory of its own under /tmp (the kubelet's sockets are below it,
and a unix socket path holds 107 bytes); the shared directory records where.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kustomize_render import SHARED_DIR_ENV
from outside_process import AdminAccess, launched, locked, stop, unpacked

ROOT = Path(__file__).resolve().parents[1]
ARCHIVE = ROOT.parent / "shared" / "tools" / "realcluster.gz"
AVAILABLE = ARCHIVE.is_file() and shutil.which("kubectl") is not None and os.geteuid() == 0
SKIP_REASON = "../shared/tools/realcluster.gz, kubectl or root is missing (CI has them)"
START_TIMEOUT_S = 90.0
# The run's clusters: each test holds one alone, so two halve the time the real-cluster tests
# take one after another (their waits are the kubelet's 10 s status period, not CPU).
CLUSTERS = ("realcluster", "realcluster-2")


@dataclass(frozen=True)
class RealCluster(AdminAccess):
    """A running cluster, as its ready line describes it."""

    url: str
    kubeconfig: Path  # the admin's (system:masters)
    ca: Path
    node: str
    kubelet_root: Path
    cri_log: Path
    log: Path
    pod_resources_socket: Path
    pid: int
    dir: Path  # its state: etcd, the kubelet's root, the runtime's records
    home: Path  # the harness's: the binary, the ready line, the locks

    def created_containers(self, pod_uid: str | None = None) -> list[dict[str, Any]]:
        """The runtime's CreateContainer records (of one pod's, given its UID), oldest first."""
        records = []
        with contextlib.suppress(FileNotFoundError):
            for line in self.cri_log.read_text().splitlines():
                with contextlib.suppress(ValueError):
                    record = json.loads(line)
                    if pod_uid is None or record.get("pod_uid") == pod_uid:
                        records.append(record)
        return records


# --- the run's main process ------------------------------------------------------------------

_held_stdin: list[int] = []


def configure(shared: Path) -> None:
    """In the run's main process, before the workers start: for each of the run's clusters, the
    FIFO it reads as stdin, held open here."""
    for name in CLUSTERS:
        home = shared / name
        home.mkdir()
        os.mkfifo(home / "stdin")
        _held_stdin.append(os.open(home / "stdin", os.O_RDWR | os.O_NONBLOCK))


def unconfigure(shared: Path) -> None:
    """In the run's main process, after the workers ended: stop the clusters, remove their
    state."""
    for name in CLUSTERS:
        home = shared / name
        with contextlib.suppress(FileNotFoundError):
            ready = json.loads((home / "ready.json").read_text())
            stop(ready["pid"], what="realcluster", grace_s=20.0, poll_s=0.02)
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree((home / "dir").read_text(), ignore_errors=True)
    while _held_stdin:
        os.close(_held_stdin.pop())


# --- the tests' side -------------------------------------------------------------------------


@contextlib.contextmanager
def held(name: str = CLUSTERS[0]) -> Iterator[RealCluster]:
    """The run's cluster `name` (started now if it is not yet), this test's alone until it is
    done."""
    home = _home(name)
    with locked(home / "use.lock"):
        yield _started(home)


def restart(cluster: RealCluster) -> RealCluster:
    """Stop the cluster and start it again on its directory: etcd's data, the kubelet's
    checkpoints and the runtime's state are kept (a node rebooting with pods bound to it)."""
    home = cluster.home
    stop(cluster.pid, what="realcluster", grace_s=20.0, poll_s=0.02)
    (home / "ready.json").unlink()
    return _start(home, cluster.dir)


@contextlib.contextmanager
def private() -> Iterator[RealCluster]:
    """A cluster of its own (for a benchmark, outside a test run), stopped and removed on exit."""
    home = Path(tempfile.mkdtemp(prefix="rch-"))
    os.mkfifo(home / "stdin")
    holder = os.open(home / "stdin", os.O_RDWR | os.O_NONBLOCK)
    state = Path(tempfile.mkdtemp(prefix="rc-", dir="/tmp"))
    try:
        cluster = _start(home, state)
        try:
            yield cluster
        finally:
            stop(cluster.pid, what="realcluster", grace_s=20.0, poll_s=0.02)
    finally:
        os.close(holder)
        shutil.rmtree(state, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)


def _home(name: str) -> Path:
    shared_dir = os.environ.get(SHARED_DIR_ENV)
    if shared_dir is None:  # a test run without the suite's conftest
        raise RuntimeError(f"{SHARED_DIR_ENV} is not set: run the tests through pytest")
    return Path(shared_dir) / name


def _started(home: Path) -> RealCluster:
    ready = home / "ready.json"
    if ready.exists():
        return _cluster(json.loads(ready.read_text()), home)
    state = Path(tempfile.mkdtemp(prefix="rc-", dir="/tmp"))
    (home / "dir").write_text(str(state))
    return _start(home, state)


def _start(home: Path, state: Path) -> RealCluster:
    binary = unpacked(ARCHIVE, home / "realcluster")
    command = [str(binary), "-dir", str(state)]
    ready = launched(command, home=home, what="realcluster", timeout_s=START_TIMEOUT_S, poll_s=0.05)
    return _cluster(ready, home)


def _cluster(ready: dict[str, Any], home: Path) -> RealCluster:
    return RealCluster(
        home=home,
        url=ready["url"],
        kubeconfig=Path(ready["kubeconfig"]),
        ca=Path(ready["ca"]),
        node=ready["node"],
        kubelet_root=Path(ready["kubelet_root"]),
        cri_log=Path(ready["cri_log"]),
        log=Path(ready["log"]),
        pod_resources_socket=Path(ready["pod_resources_socket"]),
        pid=int(ready["pid"]),
        dir=Path(ready["dir"]),
    )
