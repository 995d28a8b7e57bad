"""Why `run-dra` must not start on a node: a device plugin already serves its resource names.

A node is served by the device plugin (`run`) or by DRA, never both: both would hand out the same
GPUs, and the scheduler gives a pod asking an extended resource (`nvidia.com/gpu: 1`) to the
device plugin on every node whose allocatable lists that name with a count above zero, to DRA
only elsewhere. Two signs are read at start, each reliable for what it covers:

- Our device plugin's sockets in `<kubelet-dir>/device-plugins/` that somebody listens on: a
  `run` that is serving now, whatever the kubelet has reported yet. A killed `run` leaves
  sockets nobody listens on, which do not count.
- The Node's `status.allocatable`: a name of ours with a count above zero is served by some
  device plugin (ours, or another such as NVIDIA's), as the scheduler sees it. The kubelet sets
  the count to zero when the plugin goes away and posts it with its next node status (about
  10 s), and drops the name after its grace period; a count of zero is no conflict.

Either is a `StartupError` that says what to do: the pod restarts with backoff and starts once
the device plugin is gone (docs/contract.md, "Moving a node from run to run-dra").
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from sharing_plugin.errors import StartupError
from sharing_plugin.kubelet.server import live_sockets

if TYPE_CHECKING:
    from lightkube import AsyncClient

log = logging.getLogger(__name__)


def served_by_a_device_plugin(names: Iterable[str], allocatable: Mapping[str, str]) -> list[str]:
    """The names of `names` the node lists as allocatable with a count above zero."""
    return sorted(n for n in set(names) if _positive(allocatable.get(n)))


def _positive(quantity: str | None) -> bool:
    if quantity is None:
        return False
    try:
        return int(quantity) > 0
    except ValueError:
        return quantity.strip() not in ("", "0")  # not a plain count: trust that it is some


def conflict_message(
    *, node: str, kubelet_dir: Path, sockets: Sequence[Path], served: Mapping[str, str]
) -> str | None:
    """The error for an admin, or None when nothing conflicts."""
    found = []
    if sockets:
        found.append(
            f"the device plugin (sharing-plugin run) serves on this node: "
            f"{', '.join(p.name for p in sockets)} in {kubelet_dir / 'device-plugins'}"
        )
    if served:
        counts = ", ".join(f"{name}: {count}" for name, count in served.items())
        found.append(
            f"node {node} has {counts} allocatable from a device plugin (ours or another), "
            "so the scheduler would give pods asking for it to that plugin, not to DRA"
        )
    if not found:
        return None
    return (
        "; ".join(found) + ". A node is served by the device plugin or by run-dra, never both: "
        "stop the device plugin on this node first (label the node gpu.sharing-plugin.io/dra=true, "
        "which deploy/ excludes and deploy/dra/ selects); run-dra starts once the kubelet reports "
        "none of these names allocatable (about 10 s after the plugin stopped)"
    )


async def check_no_device_plugin(
    *, client: AsyncClient, node: str, kubelet_dir: Path, names: Iterable[str]
) -> None:
    """Raise StartupError when a device plugin serves `names` on this node (module docstring).
    A Node that cannot be read leaves only the socket check, with a warning."""
    from lightkube.resources.core_v1 import Node

    sockets = live_sockets(kubelet_dir)
    allocatable: Mapping[str, str] = {}
    try:
        found = await client.get(Node, node)
        if found.status is not None and found.status.allocatable:
            allocatable = {str(k): str(v) for k, v in found.status.allocatable.items()}
    except Exception as exc:
        log.warning(
            "cannot read node %s's allocatable resources (%s): only this node's device plugin "
            "sockets are checked for a device plugin serving the same names",
            node,
            exc,
        )
    served = {n: allocatable[n] for n in served_by_a_device_plugin(names, allocatable)}
    message = conflict_message(node=node, kubelet_dir=kubelet_dir, sockets=sockets, served=served)
    if message is not None:
        raise StartupError(message)


def check_no_device_plugin_serving(*, node: str, kubelet_dir: Path) -> None:
    """Raise StartupError when our device plugin serves in `kubelet_dir` now: checked before
    the first config is applied, so that `run-dra` makes no MIG change under `run`'s pods."""
    sockets = live_sockets(kubelet_dir)
    message = conflict_message(node=node, kubelet_dir=kubelet_dir, sockets=sockets, served={})
    if message is not None:
        raise StartupError(message)
