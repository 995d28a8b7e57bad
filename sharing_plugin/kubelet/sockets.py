"""Our sockets in `<kubelet-dir>/device-plugins`: their names, the stale ones a killed plugin left,
the live ones of other instances.

Socket names are unique per start (`sharing-<slug>-<random>.sock`): kubelet identifies a plugin
by its endpoint, and a name reused across restarts could be mistaken for a stale one. The slug
keeps only `[a-z0-9.-]` of the resource name, so nothing an admin types reaches a path unchecked;
two instances on one kubelet dir name one resource's sockets alike but for the random part.
"""

from __future__ import annotations

import logging
import re
import secrets
from pathlib import Path

from sharing_plugin.kit import unix_grpc
from sharing_plugin.kubelet.api.constants import DEVICE_PLUGINS_DIR

__all__ = ["live_sockets", "remove_stale_sockets", "same_resource_sockets", "socket_name"]

log = logging.getLogger(__name__)

_UNSAFE = re.compile(r"[^a-z0-9.-]+")
_OUR_SOCKET = re.compile(r"sharing-(?:[a-z0-9.-]*-)?[0-9a-f]{8}\.sock")
_RANDOM_PART = len("00000000.sock")


def socket_name(resource_name: str, *, max_length: int = 64) -> str:
    """A fresh socket file name for `resource_name`: `sharing-<slug>-<8 hex>.sock`."""
    slug = _UNSAFE.sub("-", resource_name.lower()).strip("-.")
    fixed = len("sharing--.sock") + 8
    slug = slug[: max(0, max_length - fixed)].strip("-.")
    parts = ["sharing", slug, secrets.token_hex(4)] if slug else ["sharing", secrets.token_hex(4)]
    return "-".join(parts) + ".sock"


def remove_stale_sockets(kubelet_dir: Path) -> list[Path]:
    """Delete the sockets a killed plugin left in `<kubelet_dir>/device-plugins`; the removed.

    Only files named like ours (`socket_name`) that are sockets and that nobody listens on: a
    second instance starting while the first still serves keeps its socket, and kubelet.sock
    and other plugins' sockets are never touched.
    """
    removed: list[Path] = []
    try:
        entries = list((Path(kubelet_dir) / DEVICE_PLUGINS_DIR).iterdir())
    except OSError:
        return removed  # no directory yet: nothing to clean
    for path in entries:
        if not _OUR_SOCKET.fullmatch(path.name):
            continue
        try:
            if unix_grpc.probe(path) is not unix_grpc.SocketState.STALE:
                continue
            path.unlink()
        except OSError as exc:
            log.warning("cannot remove stale socket %s: %s", path, exc)
            continue
        removed.append(path)
    if removed:
        log.info(
            "removed %d stale socket(s) of an earlier run: %s",
            len(removed),
            ", ".join(p.name for p in removed),
        )
    return removed


def same_resource_sockets(own: Path) -> list[Path]:
    """The live sockets of other instances serving the resource that `own` (one of our sockets)
    serves: same directory, same name but for its random part; in name order."""
    prefix = own.name[:-_RANDOM_PART]
    return [
        p for p in live_sockets(own.parent.parent) if p != own and p.name[:-_RANDOM_PART] == prefix
    ]


def live_sockets(kubelet_dir: Path) -> list[Path]:
    """Our sockets in `<kubelet_dir>/device-plugins` that somebody listens on (a running `run`),
    in name order; a missing or unreadable directory has none."""
    try:
        entries = sorted((Path(kubelet_dir) / DEVICE_PLUGINS_DIR).iterdir())
    except OSError:
        return []
    live: list[Path] = []
    for path in entries:
        if not _OUR_SOCKET.fullmatch(path.name):
            continue
        try:
            if unix_grpc.probe(path) is unix_grpc.SocketState.LIVE:
                live.append(path)
        except OSError:
            continue
    return live
