"""What the API server keeps of the ResourceSlices `run-dra` writes, and so what it publishes.

Three features of resource.k8s.io/v1 carry fields a server can drop: consumable capacity (shared
GPUs as one device whose memory claims consume, else one device per replica), device taints (an
Unhealthy GPU's devices stay published tainted, else they leave the pool) and partitionable
devices (dynamic MIG's counter sets, else no placements). At start the API version decides the
first and the third, and a dry run the second; a server with a feature's gate off drops its
fields on write, silently, so what each write stored is read back (`views.dra_api.
dropped_features`) and a feature found dropped is given up, said once in the log (and in
`/status` for capacity).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from sharing_plugin.config.base import SharedDevices
from sharing_plugin.dra.features import keeps_device_taints
from sharing_plugin.errors import KubeApiError, StartupError
from sharing_plugin.observability.status import StatusBoard
from sharing_plugin.views.dra_api import (
    CONSUMABLE_CAPACITY,
    DEVICE_TAINTS,
    PARTITIONABLE_DEVICES,
    V1,
)

if TYPE_CHECKING:
    from lightkube import AsyncClient

log = logging.getLogger(__name__)


class ServerFeatures:
    """The features `run-dra` may use on this API server; all off until `discover`. Once
    discovered, the pool's writer is its only owner: it gives a feature up when a write shows
    the server dropped its fields."""

    def __init__(self, status: StatusBoard) -> None:
        self._status = status
        self.capacity = False
        self.taints = False
        # Why the server cannot take dynamic MIG's counter sets (None: it can).
        self.unpartitionable: str | None = "not connected yet"

    async def discover(
        self, client: AsyncClient, version: str, *, driver: str, node_name: str
    ) -> None:
        """What `version` allows, and whether the server keeps device taints (a dry run)."""
        self.capacity = version == V1
        if not self.capacity:
            self._by_replica(f"{version} has no consumable capacity")
        self.unpartitionable = None
        if version != V1:
            self.unpartitionable = (
                "dynamic MIG needs partitionable devices (resource.k8s.io/v1, Kubernetes 1.34+); "
                f"this API server serves only {version}"
            )
        if version == V1:
            try:
                self.taints = await keeps_device_taints(client, driver=driver, node_name=node_name)
            except KubeApiError as exc:
                raise StartupError(str(exc)) from exc
        if not self.taints:
            log.warning(
                "the API server keeps no device taints on %s ResourceSlices: Unhealthy GPUs "
                "leave the pool instead of staying in it tainted",
                version,
            )

    def dropped(self, features: frozenset[str]) -> bool:
        """The server did not keep the fields of `features` in a slice written: give them up.
        Whether anything changed (the pool must then be computed again).

        The start-up probe asks about taints before anything is published; this read-back also
        catches a server that answered the probe otherwise (one that ignores dry runs, or whose
        gate changed since)."""
        changed = False
        if CONSUMABLE_CAPACITY in features and self.capacity:
            self.capacity = False
            self._by_replica(
                "the API server does not keep the consumable-capacity fields of ResourceSlices "
                f"(feature gate {CONSUMABLE_CAPACITY} off?)"
            )
            changed = True
        if DEVICE_TAINTS in features and self.taints:
            self.taints = False
            log.warning(
                "the API server did not keep the devices' taints of a ResourceSlice (feature "
                "gate %s off?): Unhealthy GPUs leave the pool instead of staying in it tainted",
                DEVICE_TAINTS,
            )
            changed = True
        if PARTITIONABLE_DEVICES in features and self.unpartitionable is None:
            self.unpartitionable = (
                "the API server does not keep the partitionable-device fields of "
                f"ResourceSlices (feature gate {PARTITIONABLE_DEVICES} off?)"
            )
            # Placements without their counters would let the scheduler allocate overlapping
            # instances, which NVML would then refuse at prepare: none are published.
            log.error(
                "%s: the GPUs of dynamic MIG entries are not published; remove dynamic and "
                "declare profiles",
                self.unpartitionable,
            )
            changed = True
        return changed

    def dynamic_refused(self) -> str | None:
        """Why dynamic MIG entries cannot be served (None: they can)."""
        if self.unpartitionable is None:
            return None
        return f"{self.unpartitionable}: remove dynamic and declare profiles"

    def _by_replica(self, why: str) -> None:
        log.warning("%s: shared GPUs are published as one device per replica", why)
        self._status.set_dra(shared_devices=SharedDevices.REPLICAS.value, reason=why)
