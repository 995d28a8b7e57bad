"""A real kube-apiserver with embedded etcd (`../shared/tools/realapi.gz`, Kubernetes 1.36; its
README there), started once per test run and shared by every test process of it.

The server takes ~3 s and ~2 s of CPU to start, so the first test that needs it starts it and
the others use it: pytest-xdist's workers share it through the run's shared directory (made by
tests/conftest.py), where a lock makes a second worker wait for the first, and the ready line
is kept for the others to read. It runs detached from the process that started it (whichever
worker restarts it, or the run's main process stopping it at the end, need not be its parent),
with stdin on a FIFO that only the run's main process holds open for writing: the server stops
on stdin EOF, so it cannot outlive the run even when the run is killed.

Tests share one server, so each uses its own namespaces and node names (`unique`). A test may
restart the server (same data, same port) only while it holds it alone (`exclusive`), which
waits for the tests using it (`shared`) to finish and keeps new ones waiting.

The server writes an audit log of every request made with a ServiceAccount token (level
Metadata: user, verb, resource, namespace, name, the request URI, the response code and the
authorizer's decision), so a test can see what the real RBAC authorizer decided.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kustomize_render import SHARED_DIR_ENV
from outside_process import AdminAccess, launched, locked, stop, unpacked

ROOT = Path(__file__).resolve().parents[1]
ARCHIVE = ROOT.parent / "shared" / "tools" / "realapi.gz"
AVAILABLE = ARCHIVE.is_file()
SKIP_REASON = "../shared/tools/realapi.gz is absent (only CI has it)"
START_TIMEOUT_S = 60.0

_AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    userGroups: ["system:serviceaccounts"]
  - level: None
"""


@dataclass(frozen=True)
class RealApi(AdminAccess):
    """A running server, as its ready line describes it."""

    url: str
    kubeconfig: Path  # the admin's (a token in system:masters)
    ca: Path
    token: str
    pid: int
    home: Path  # where the binary, its data (`state/`) and its logs live

    @property
    def port(self) -> int:
        return int(self.url.rpartition(":")[2])

    @property
    def audit_log(self) -> Path:
        return self.home / "audit.log"

    def audit(self, user: str) -> list[dict[str, Any]]:
        """The audit events of `user` so far (a line being written is left out)."""
        events = []
        with contextlib.suppress(FileNotFoundError):
            for line in self.audit_log.read_text().splitlines():
                with contextlib.suppress(ValueError):
                    event = json.loads(line)
                    if event.get("user", {}).get("username") == user:
                        events.append(event)
        return events


def unique(prefix: str) -> str:
    """A name no other test uses (namespaces, nodes): the server is shared."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# --- the run's main process ------------------------------------------------------------------

_held_stdin: list[int] = []


def configure(shared: Path) -> None:
    """In the run's main process, before the workers start: the FIFO the server reads as stdin,
    held open here (the server stops when the run ends, whatever way it ends)."""
    home = shared / "realapi"
    home.mkdir()
    os.mkfifo(home / "stdin")
    _held_stdin.append(os.open(home / "stdin", os.O_RDWR | os.O_NONBLOCK))


def unconfigure(shared: Path) -> None:
    """In the run's main process, after the workers ended: stop the server if one started."""
    home = shared / "realapi"
    with contextlib.suppress(FileNotFoundError):
        pid = json.loads((home / "ready.json").read_text())["pid"]
        stop(pid, what="realapi", grace_s=10.0)
    while _held_stdin:
        os.close(_held_stdin.pop())


# --- the tests' side -------------------------------------------------------------------------


@contextlib.contextmanager
def shared() -> Iterator[RealApi]:
    """The run's server (started now if it is not yet), used beside other tests."""
    home = _home()
    with locked(home / "use.lock", fcntl.LOCK_SH):
        yield _started(home)


@contextlib.contextmanager
def exclusive() -> Iterator[RealApi]:
    """The run's server, once no other test uses it, and none may until this one is done."""
    home = _home()
    with locked(home / "use.lock", fcntl.LOCK_EX):
        yield _started(home)


@contextlib.contextmanager
def held(name: str) -> Iterator[None]:
    """A lock of the run's server, by name: for objects whose names tests cannot choose."""
    with locked(_home() / f"{name}.lock", fcntl.LOCK_EX):
        yield


def restart(api: RealApi) -> RealApi:
    """Stop the server and start it again on the same data and port (hold it `exclusive`)."""
    home = api.home
    with locked(home / "start.lock", fcntl.LOCK_EX):
        stop(api.pid, what="realapi", grace_s=10.0)
        (home / "ready.json").unlink()
        return _start(home, port=api.port)


@contextlib.contextmanager
def private(home: Path) -> Iterator[RealApi]:
    """A server of its own in `home` (for a benchmark, outside a test run), stopped on exit."""
    home.mkdir(parents=True, exist_ok=True)
    os.mkfifo(home / "stdin")
    held = os.open(home / "stdin", os.O_RDWR | os.O_NONBLOCK)
    try:
        api = _start(home, port=0)
        try:
            yield api
        finally:
            stop(api.pid, what="realapi", grace_s=10.0)
    finally:
        os.close(held)


def _home() -> Path:
    shared_dir = os.environ.get(SHARED_DIR_ENV)
    if shared_dir is None:  # a test run without the suite's conftest
        raise RuntimeError(f"{SHARED_DIR_ENV} is not set: run the tests through pytest")
    return Path(shared_dir) / "realapi"


def _started(home: Path) -> RealApi:
    with locked(home / "start.lock", fcntl.LOCK_EX):
        ready = home / "ready.json"
        if ready.exists():
            return _api(json.loads(ready.read_text()), home)
        return _start(home, port=0)


def _start(home: Path, *, port: int) -> RealApi:
    binary = unpacked(ARCHIVE, home / "realapi")
    policy = home / "audit-policy.yaml"
    policy.write_text(_AUDIT_POLICY)
    command = [
        str(binary),
        "-dir",
        str(home / "state"),
        "-port",
        str(port),
        "-log",
        str(home / "realapi.log"),
        "--",
        f"--audit-policy-file={policy}",
        f"--audit-log-path={home / 'audit.log'}",
        "--audit-log-format=json",
        # At a stop, open watches are ended by the server (as at a control-plane upgrade)
        # instead of holding the stop until the harness gives up on them (20 s).
        "--shutdown-watch-termination-grace-period=2s",
    ]
    ready = launched(command, home=home, what="realapi", timeout_s=START_TIMEOUT_S, poll_s=0.02)
    return _api(ready, home)


def _api(ready: dict[str, Any], home: Path) -> RealApi:
    return RealApi(
        url=ready["url"],
        kubeconfig=Path(ready["kubeconfig"]),
        ca=Path(ready["ca"]),
        token=ready["token"],
        pid=int(ready["pid"]),
        home=home,
    )
