"""The state file of one resource's control daemon, written by `mps-control`, read by `run`.

`<mpsRoot>/<resource>/daemon.json` says what the control side knows: the daemon's state, pid,
limits and the fingerprint of what it was started for, how often it restarted, and when this
was last confirmed. The control side rewrites it on every change and at every heartbeat (each
after asking the daemon), always by writing a hidden file and renaming it over this one, so a
reader never sees half a document. It sits beside the pipe directory, not in it: containers get
the pipe directory mounted, and a pod must not be able to forge its daemon's health.

States: `starting`, `ready` (answering, limits set), `waiting` (a change of GPUs or limits waits
for pods to release replicas; the daemon keeps serving with its old limits), `restarting` (died
or stopped answering; restarting with backoff), `failed` (cannot start; retrying). Only `ready`
and `waiting` serve clients.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

RECORD_FILE = "daemon.json"


class DaemonState(StrEnum):
    STARTING = "starting"
    READY = "ready"
    WAITING = "waiting"
    RESTARTING = "restarting"
    FAILED = "failed"

    @property
    def serving(self) -> bool:
        return self in (DaemonState.READY, DaemonState.WAITING)


@dataclass(frozen=True, slots=True)
class DaemonRecord:
    """One resource's control daemon as the control side last saw it."""

    resource: str
    state: DaemonState
    fingerprint: str
    pid: int | None = None
    limits: dict[str, Any] = field(default_factory=dict)
    restarts: int = 0
    reason: str | None = None
    heartbeat_s: float = 10.0
    updated_at: float = 0.0  # Unix time of the last confirmation

    def to_json(self) -> dict[str, Any]:
        return {
            "resource": self.resource,
            "state": self.state.value,
            "fingerprint": self.fingerprint,
            "pid": self.pid,
            "limits": self.limits,
            "restarts": self.restarts,
            "reason": self.reason,
            "heartbeatSeconds": self.heartbeat_s,
            "updatedAt": _rfc3339(self.updated_at),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DaemonRecord:
        pid = data.get("pid")
        limits = data.get("limits")
        reason = data.get("reason")
        return cls(
            resource=str(data["resource"]),
            state=DaemonState(data["state"]),
            fingerprint=str(data["fingerprint"]),
            pid=pid if isinstance(pid, int) else None,
            limits=limits if isinstance(limits, dict) else {},
            restarts=int(data.get("restarts", 0)),
            reason=reason if isinstance(reason, str) else None,
            heartbeat_s=float(data.get("heartbeatSeconds", 10.0)),
            updated_at=dt.datetime.fromisoformat(str(data["updatedAt"])).timestamp(),
        )


def _rfc3339(moment: float) -> str:
    utc = dt.datetime.fromtimestamp(moment, dt.UTC)
    return utc.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def read_record(root: Path) -> DaemonRecord | None:
    """The record in `root` (`<mpsRoot>/<resource>`); None when absent or unreadable."""
    try:
        data = json.loads((root / RECORD_FILE).read_text(encoding="utf-8"))
        return DaemonRecord.from_json(data)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_record(root: Path, record: DaemonRecord) -> None:
    """Replace the record in `root` in one rename."""
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{RECORD_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(record.to_json(), indent=1) + "\n", encoding="utf-8")
    tmp.replace(root / RECORD_FILE)


def remove_record(root: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        (root / RECORD_FILE).unlink()
