"""What the kubelet adapter records about itself, as types: the daemon hands in its metrics.

A `Protocol` rather than the metrics class keeps this adapter independent of the HTTP/metrics
adapter (an import contract checks it).
"""

from __future__ import annotations

from typing import Protocol


class KubeletRecorder(Protocol):
    """The calls the resource servers make on the process's metrics."""

    def set_registered(self, resource: str, registered: bool) -> None: ...

    def count_registration(self, resource: str, *, ok: bool = True) -> None: ...

    def observe_allocate(self, resource: str, seconds: float, *, ok: bool = True) -> None: ...


class PodResourcesRecorder(Protocol):
    """The call the PodResources client makes on the process's metrics."""

    def count_pod_resources_error(self) -> None: ...
