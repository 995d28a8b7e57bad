"""Which pod and container a process belongs to, read from the text of `/proc/<pid>/cgroup`.

Kubelet puts every container of a pod under one cgroup named after the pod's UID, below the
QoS class's (none for Guaranteed, `burstable`, `besteffort`); the runtime makes the container's
cgroup inside it, named after the container's ID. How the names are written depends on the
cgroup driver and the runtime:

- cgroupfs driver: ``/kubepods/burstable/pod<uid>/<id>`` (CRI-O: ``.../crio-<id>``);
- systemd driver: ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/
  cri-containerd-<id>.scope`` (CRI-O ``crio-<id>.scope``, Docker ``docker-<id>.scope``), with
  the UID's dashes written as underscores (a dash separates a slice from its parent in systemd);
  kind and some distributions put the whole tree under ``/kubelet.slice/kubelet-kubepods.slice``.

cgroup v1 lists one line per hierarchy (``<n>:<controllers>:<path>``), v2 a single
``0::<path>``; in hybrid mode both appear. Every line is looked at: the first naming a pod
decides. The v2 path is kept as read: it names the cgroup NVML caps GPU memory on. A static
pod's UID is a 32-digit hash without dashes, kept as it is. The container ID is the runtime's
64 hex digits; CRI-O's monitor process (``crio-conmon-<id>``) and anything else below the pod
that is not a container ID give the pod without a container.
"""

from __future__ import annotations

import re
from dataclasses import replace

from sharing_plugin.usage.model import CgroupRef

_UID = r"[0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12}"
# A whole path segment: `pod<uid>` (cgroupfs) or `<parent slices>-pod<uid>.slice` (systemd).
_POD = re.compile(rf"(?:[\w.-]*-)?pod({_UID}|[0-9a-fA-F]{{32}})(?:\.slice)?")
_CONTAINER = re.compile(
    r"(?:cri-containerd-|crio-|docker-|containerd-)?([0-9a-fA-F]{64})(?:\.scope)?"
)


def parse_cgroup(text: str) -> CgroupRef | None:
    """The pod (and container) the cgroup file `text` places its process in; None for a
    process in no pod's cgroup (a host daemon, a process of the node itself)."""
    unified = ""
    for line in text.splitlines():
        hierarchy, sep, rest = line.partition(":")
        controllers, sep2, path = rest.partition(":")
        if sep and sep2 and hierarchy == "0" and not controllers:
            unified = path.strip()
    for line in text.splitlines():
        _, sep, rest = line.partition(":")
        _, sep2, path = rest.partition(":")
        if not (sep and sep2):
            continue
        found = _in_path(path.strip())
        if found is not None:
            return replace(found, path=unified)
    return None


def _in_path(path: str) -> CgroupRef | None:
    segments = [s for s in path.split("/") if s]
    for i, segment in enumerate(segments):
        pod = _POD.fullmatch(segment)
        if pod is None:
            continue
        uid = pod.group(1).replace("_", "-").lower()
        container = None
        if i + 1 < len(segments):
            match = _CONTAINER.fullmatch(segments[i + 1])
            if match is not None:
                container = match.group(1).lower()
        return CgroupRef(pod_uid=uid, container_id=container)
    return None


def container_id(runtime_id: str) -> str:
    """``containerd://<id>`` (a pod status's containerID) -> ``<id>``, as a cgroup names it."""
    return runtime_id.partition("://")[2].lower() if "://" in runtime_id else runtime_id.lower()
