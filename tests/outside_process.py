"""What the harnesses of the real tools started outside pytest's process tree share: admin access
to their API server (kubectl, a token kubeconfig), the file locks that let one run's workers
share one instance, and stopping a process that is nobody's child."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path


class AdminAccess:
    """kubectl and kubeconfigs for an API server described by `url`, `ca` and the admin's
    `kubeconfig` (the harness's dataclass has those fields)."""

    url: str
    ca: Path
    kubeconfig: Path

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        """`kubectl --kubeconfig ADMIN ARGS...`; its stdout (AssertionError with stderr when it
        fails and `check`)."""
        done = subprocess.run(
            ["kubectl", "--kubeconfig", str(self.kubeconfig), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if check:
            assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
        return done.stdout + (done.stderr if not check else "")

    def token_kubeconfig(self, path: Path, token: str, *, namespace: str = "default") -> Path:
        """A kubeconfig for this server with a bearer token (a ServiceAccount's)."""
        cluster = {"server": self.url, "certificate-authority": str(self.ca)}
        context = {"cluster": "c", "user": "u", "namespace": namespace}
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "c", "cluster": cluster}],
                    "users": [{"name": "u", "user": {"token": token}}],
                    "contexts": [{"name": "c", "context": context}],
                    "current-context": "c",
                }
            )
        )
        return path


@contextlib.contextmanager
def locked(path: Path, how: int = fcntl.LOCK_EX) -> Iterator[None]:
    """`path` locked (`fcntl.LOCK_EX` or `LOCK_SH`) across the run's processes."""
    with open(path, "a") as handle:
        fcntl.flock(handle, how)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def stop(pid: int, *, what: str, grace_s: float, poll_s: float = 0.01) -> None:
    """SIGTERM, then wait until the process is gone (or a zombie its new parent has not reaped
    yet); SIGKILL past `grace_s`, then 10 s more."""
    for sig, within in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + within
        while alive(pid) and time.monotonic() < deadline:  # not our child: nothing to wait on
            time.sleep(poll_s)
        if not alive(pid):
            return
    raise RuntimeError(f"{what} (pid {pid}) did not stop")


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"
