"""Noticing a registration that kubelet dropped before it opened our ListAndWatch stream.

Kubelet (1.32 devicemanager/plugin/v1beta1) dials a plugin back inside Register and asks for its
options; it then opens the ListAndWatch stream from a goroutine, on the connection it already
holds, and answers Register. When the resource's client is disconnected in that moment (a
superseded stream of the same resource ended: `runClient` disconnects whichever client it then
holds), the connection is closed before the stream reaches us, so no stream of ours ends and
nothing else tells us: kubelet counts the resource's devices Unhealthy and never dials again,
while we believe we are registered. A registration that no stream follows is therefore one that
kubelet dropped, and is reported like a stream kubelet ended, so that the owner registers again.

STREAM_OPEN_BOUND_S: the stream needs no new connection and is started before Register's answer
is sent, so only our own event loop delays it (against the real device manager it opened within
milliseconds of Register's answer). A stream misjudged as missing costs one more registration,
which leaves the late stream serving beside the new one; each second of the bound is a second in
which kubelet refuses the resource's pods. One second is far above the first and short for the
second.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from sharing_plugin.kubelet.servicer import DevicePluginServicer

log = logging.getLogger(__name__)

STREAM_OPEN_BOUND_S = 1.0


class StreamWatch:
    """Expects a ListAndWatch stream after each registration; calls `on_missing(servicer)`
    when none opened on the registered servicer within `bound_s`."""

    def __init__(
        self,
        name: str,
        on_missing: Callable[[DevicePluginServicer], None],
        *,
        bound_s: float = STREAM_OPEN_BOUND_S,
    ) -> None:
        self._name = name
        self._on_missing = on_missing
        self.bound_s = bound_s
        self._task: asyncio.Task[None] | None = None

    def expect(self, servicer: DevicePluginServicer, *, opened_before: int) -> None:
        """A registration of `servicer`'s socket was accepted, when `opened_before` of its
        streams had opened: a new one must follow. Replaces the previous expectation."""
        self.cancel()
        self._task = asyncio.get_running_loop().create_task(
            self._watch(servicer, opened_before), name=f"stream-watch:{self._name}"
        )

    def cancel(self) -> None:
        """Forget the expectation (the registration is over: stopped, replaced or failed)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()

    async def _watch(self, servicer: DevicePluginServicer, opened_before: int) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            async with asyncio.timeout(self.bound_s):
                await servicer.wait_opened(opened_before)
        except TimeoutError:
            self._task = None
            self._on_missing(servicer)
            return
        log.debug(
            "kubelet opened the ListAndWatch stream of %s %.1f ms after registering",
            self._name,
            (loop.time() - started) * 1000,
        )
