"""The prepared claims, kept on disk so that prepare and unprepare survive plugin restarts.

The kubelet calls NodePrepareResources again for a claim whenever it is unsure (a restart of
either side, a retried pod start) and NodeUnprepareResources for claims prepared by an earlier
run of the plugin; both must answer as they did. The checkpoint holds, per claim UID, the answer
given (devices, CDI IDs), the spec file written, and what was published for each device, so a
device a new config dropped stays published until its claim is unprepared, restarts included;
of a share of a device published by capacity, also the memory its allocation consumed and what
its request asked. Fields added since the first version are optional both ways: a file of an
earlier version loads (those values unknown), and an earlier version reads ours (it skips them,
and drops them when it writes the file).

Written as JSON with a checksum, by temporary file and rename, so a crash leaves the old or the
new file, never half of one. A file that does not check out is kept aside (`.corrupt`) and the
plugin starts empty, logging it: the kubelet will prepare again what it still needs.

Two instances of the driver share the file while a rolling update overlaps them (the kubelet may
ask either for any claim): every change is a read-merge-write under an exclusive lock on a file
beside it (`update`), so neither loses the other's claims, and `current()` reads the file again
whenever it was replaced. The lock is held only around the file's own I/O, never across an API
call, so it is taken synchronously.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from sharing_plugin.dra.api.constants import PLUGINS_DIR
from sharing_plugin.dra.claims import ClaimRef
from sharing_plugin.views.dra_api import PublishedDevice

log = logging.getLogger(__name__)

_T = TypeVar("_T")

CHECKPOINT_FILE = "checkpoint.json"


def checkpoint_path(kubelet_dir: Path, driver: str) -> Path:
    """Where `run-dra` keeps the checkpoint of `driver`: in the driver's plugin directory."""
    return Path(kubelet_dir) / PLUGINS_DIR / driver / CHECKPOINT_FILE


_VERSION = 1


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One device of a prepared claim, as NodePrepareResources answered it."""

    requests: tuple[str, ...]
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    share_id: str | None = None  # the share of a device claims consume (consumable capacity)
    # With consumable capacity, the memory the allocation consumed of the device and what the
    # request asked (None: it asked nothing). A checkpoint of an earlier version has neither.
    consumed_mib: int | None = None
    asked_mib: int | None = None


@dataclass(frozen=True, slots=True)
class PreparedClaim:
    """A claim prepared on this node: the answer given, its spec file, its devices' entries."""

    ref: ClaimRef
    devices: tuple[PreparedDevice, ...]
    spec_file: str
    published: tuple[PublishedDevice, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "namespace": self.ref.namespace,
            "name": self.ref.name,
            "uid": self.ref.uid,
            "devices": [
                {
                    "requests": list(d.requests),
                    "pool": d.pool,
                    "device": d.device,
                    "cdiIds": list(d.cdi_ids),
                    **({"shareId": d.share_id} if d.share_id else {}),
                    **({"consumedMiB": d.consumed_mib} if d.consumed_mib is not None else {}),
                    **({"askedMiB": d.asked_mib} if d.asked_mib is not None else {}),
                }
                for d in self.devices
            ],
            "specFile": self.spec_file,
            "published": [p.to_json() for p in self.published],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PreparedClaim:
        return cls(
            ref=ClaimRef(str(data["namespace"]), str(data["name"]), str(data["uid"])),
            devices=tuple(
                PreparedDevice(
                    requests=tuple(str(r) for r in d["requests"]),
                    pool=str(d["pool"]),
                    device=str(d["device"]),
                    cdi_ids=tuple(str(c) for c in d["cdiIds"]),
                    share_id=str(d["shareId"]) if d.get("shareId") else None,
                    consumed_mib=_mib(d.get("consumedMiB")),
                    asked_mib=_mib(d.get("askedMiB")),
                )
                for d in data["devices"]
            ),
            spec_file=str(data["specFile"]),
            published=tuple(PublishedDevice.from_json(p) for p in data["published"]),
        )


def _mib(value: object) -> int | None:
    """A MiB count of the file; None where absent (written by an earlier version)."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"not a MiB count: {value!r}")
    return value


def held_by_resource(claims: Mapping[str, PreparedClaim]) -> dict[str, int]:
    """How many devices prepared claims hold, by the resource name each was published under."""
    held: dict[str, int] = {}
    for claim in claims.values():
        published = {p.name: p for p in claim.published}
        for device in claim.devices:
            entry = published.get(device.device)
            resource = (entry.attributes.get("resource") or {}).get("string") if entry else None
            if isinstance(resource, str):
                held[resource] = held.get(resource, 0) + 1
    return held


def _checksum(claims: list[dict[str, Any]]) -> str:
    canonical = json.dumps(claims, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


class Checkpoint:
    """The checkpoint file of one driver (in its plugin directory)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock_path = self.path.with_name(f".{self.path.name}.lock")
        self._seen: tuple[int, int, int] | None = None  # (inode, size, mtime) last read
        self._claims: dict[str, PreparedClaim] = {}

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the lock

    def update(self, change: Callable[[dict[str, PreparedClaim]], _T]) -> _T:
        """Apply `change` to the claims the file holds now and write the result, under the
        lock; what `change` returned."""
        with self._locked():
            claims = self._load()
            result = change(claims)
            self._save(claims)
        return result

    def current(self) -> dict[str, PreparedClaim]:
        """The claims the file holds, read again only when it was replaced since the last
        read (by this process or another instance); the last good read when it does not check
        out now."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._seen, self._claims = None, {}
            return {}
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
        if key != self._seen:
            found = self.peek()
            if found is not None:
                self._seen, self._claims = key, found
        return dict(self._claims)

    def load(self) -> dict[str, PreparedClaim]:
        """The prepared claims by UID; empty when there is no file or it does not check out."""
        with self._locked():
            return self._load()

    def _load(self) -> dict[str, PreparedClaim]:
        try:
            return self._read()
        except FileNotFoundError:
            return {}
        except (ValueError, KeyError, TypeError) as exc:
            aside = self.path.with_name(self.path.name + ".corrupt")
            log.error(
                "DRA checkpoint %s is unreadable (%s): starting without prepared claims; the "
                "file is kept as %s",
                self.path,
                exc,
                aside,
            )
            os.replace(self.path, aside)
            return {}

    def peek(self) -> dict[str, PreparedClaim] | None:
        """The prepared claims as the file holds them, for another process (mps-control): never
        moves or writes anything; None when the file is unreadable or does not check out (it is
        replaced whole, so a reader never sees half of one)."""
        try:
            return self._read()
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _read(self) -> dict[str, PreparedClaim]:
        """The file's claims by UID; ValueError, KeyError or TypeError when it does not check
        out, OSError when it cannot be read."""
        data = json.loads(self.path.read_text())
        claims = data["claims"]
        if data.get("version") != _VERSION or data.get("checksum") != _checksum(claims):
            raise ValueError("checksum or version mismatch")
        return {c.ref.uid: c for c in (PreparedClaim.from_json(c) for c in claims)}

    def _save(self, claims: Mapping[str, PreparedClaim]) -> None:
        entries = [claims[uid].to_json() for uid in sorted(claims)]
        data = {"version": _VERSION, "claims": entries, "checksum": _checksum(entries)}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(f".{self.path.name}.tmp")
        with temporary.open("w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, self.path)
