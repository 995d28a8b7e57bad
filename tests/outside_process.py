"""What the harnesses of the real tools started outside pytest's process tree share: the binary
unpacked, the process launched and its ready line awaited, admin access to its API server
(kubectl, a token kubeconfig), the file locks that let one run's workers share one instance, and
stopping a process that is nobody's child."""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


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


def unpacked(archive: Path, binary: Path) -> Path:
    """`binary`, unpacked from the gzip `archive` the first time (whole or not at all)."""
    if not binary.exists():
        partial = binary.with_name(binary.name + ".partial")
        with gzip.open(archive) as packed, partial.open("wb") as out:
            shutil.copyfileobj(packed, out)
        partial.chmod(0o755)
        partial.rename(binary)
    return binary


def launched(
    command: list[str], *, home: Path, what: str, timeout_s: float, poll_s: float
) -> dict[str, Any]:
    """Start `command` reading `home/stdin`, and its ready line (JSON with `"event": "ready"`),
    also kept as `home/ready.json`. Through a shell that exits at once: the process is nobody's
    child in the run, so any process of it can stop it and see it gone."""
    out = Path(tempfile.mkstemp(prefix="out-", suffix=".log", dir=home)[1])
    subprocess.run(
        ["sh", "-c", 'exec "$@" <"$STDIN" >"$OUT" 2>&1 &', "sh", *command],
        env={**os.environ, "STDIN": str(home / "stdin"), "OUT": str(out)},
        check=True,
        timeout=10,
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:  # an outside process: its output file is all there is
        for line in out.read_text().splitlines():
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if event.get("event") == "ready":
                    (home / "ready.partial").write_text(line)
                    (home / "ready.partial").rename(home / "ready.json")
                    ready: dict[str, Any] = event
                    return ready
                if event.get("ok") is False:
                    raise RuntimeError(f"{what} did not start: {line}")
        time.sleep(poll_s)
    raise RuntimeError(f"{what} not ready within {timeout_s:g} s: {out.read_text()[-2000:]}")
