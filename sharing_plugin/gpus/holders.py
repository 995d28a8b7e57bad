"""Who holds a device: a pod's container, as PodResources reports it, or a ResourceClaim.

One value for every place that asks: the MIG layout waiting for a release, per-pod usage, the
DRA claims that hold MIG instances (a claim names no container: `container` is empty).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Holder:
    """A container kubelet gave a device to, or a ResourceClaim (`container` empty)."""

    namespace: str
    pod: str  # the pod's name, or the claim's
    container: str

    @property
    def pod_key(self) -> tuple[str, str]:
        return (self.namespace, self.pod)


@dataclass(frozen=True, slots=True)
class HeldReplica:
    """One advertised device a container holds."""

    device_id: str
    resource: str
    holder: Holder
