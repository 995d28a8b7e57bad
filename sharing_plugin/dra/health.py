"""Device health for the kubelet: `DRAResourceHealth.NodeWatchResources` (dra-health/v1alpha1).

The kubelet (1.36, feature `ResourceHealthStatus`) opens one stream per registered plugin on the
plugin's DRA socket, and shows what it hears in the status of the pods that hold the devices.
Each message is the complete list of the driver's devices (a device left out becomes Unknown
once its last status times out), so a stream is sent the whole list at once, then again on
every change; a stream that is slow to read gets only the newest list.

The kubelet trusts a status for `health_check_timeout_seconds` after it arrived (its own
default: 30 s) and then shows the device as Unknown, so the list is sent again every
`resend_s` while nothing changes, well within the timeout it is sent with: a plugin that hangs
still has its devices turn Unknown, one that answers costs one message a minute.

The kubelet forgets the driver's health whenever one of its streams ends, not only that
stream's: when another instance of the driver stops (a rolling update's old pod), every device
is Unknown to it until this instance sends again, so `resend()` sends the list at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence

from sharing_plugin.dra.api.dra_health.v1alpha1 import api_pb2 as health
from sharing_plugin.dra.api.dra_health.v1alpha1 import api_pb2_grpc as health_grpc
from sharing_plugin.kit.unix_grpc import Context
from sharing_plugin.views.dra_health import DeviceHealth

log = logging.getLogger(__name__)

RESEND_S = 60.0
TIMEOUT_S = 180


class DeviceHealthServicer(health_grpc.DRAResourceHealthServicer):
    """Streams the health of one pool's devices; `publish` says what it is now."""

    def __init__(
        self,
        *,
        pool: str,
        resend_s: float = RESEND_S,
        timeout_s: int = TIMEOUT_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.pool = pool
        self._resend_s = resend_s
        self._timeout_s = timeout_s
        self._clock = clock
        self._devices: tuple[DeviceHealth, ...] = ()
        self._changed = asyncio.Event()  # set, and replaced, at every change

    def publish(self, devices: Sequence[DeviceHealth]) -> None:
        """The pool's devices are `devices` now; the open streams hear it if it changed."""
        wanted = tuple(devices)
        if wanted == self._devices:
            return
        self._devices = wanted
        self.resend()

    def resend(self) -> None:
        """The open streams send the list again now, changed or not."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def NodeWatchResources(
        self, request: health.NodeWatchResourcesRequest, context: Context
    ) -> AsyncIterator[health.NodeWatchResourcesResponse]:
        log.info("the kubelet watches the health of %d device(s)", len(self._devices))
        while True:
            changed = self._changed
            yield self._message(self._devices)
            try:
                async with asyncio.timeout(self._resend_s):
                    await changed.wait()
            except TimeoutError:
                pass  # nothing changed: the same list again, before the kubelet's timeout

    def _message(self, devices: Sequence[DeviceHealth]) -> health.NodeWatchResourcesResponse:
        now = int(self._clock())
        return health.NodeWatchResourcesResponse(
            devices=[
                health.DeviceHealth(
                    device=health.DeviceIdentifier(pool_name=self.pool, device_name=d.name),
                    health=health.HEALTHY if d.healthy else health.UNHEALTHY,
                    last_updated_time=now,
                    health_check_timeout_seconds=self._timeout_s,
                    message=d.message,
                )
                for d in devices
            ]
        )
