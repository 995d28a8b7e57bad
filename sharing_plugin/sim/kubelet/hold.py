"""A point where the simulated kubelet can be held back, to play a slow kubelet in a test.

A real kubelet answers PodResources from a state that may be a moment old by the time the answer
arrives, and calls Allocate a moment after it picked the devices from the list it last received.
Races with a reload live in those moments; a test closes a hold to open such a window at a
chosen point, checks that the simulator is waiting in it (`waiting`), acts, and opens it again.

    kubelet.pod_resources_hold.close()
    ...                                   # something asks PodResources: the answer is held
    await kubelet.wait_for(lambda: kubelet.pod_resources_hold.waiting == 1)
    ...                                   # act inside the window
    kubelet.pod_resources_hold.open()
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class Hold:
    """Open by default; while closed, every `passage()` waits until `open()`."""

    def __init__(self, on_change: Callable[[], None]) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._on_change = on_change
        self.waiting = 0

    def close(self) -> None:
        self._open.clear()

    def open(self) -> None:
        self._open.set()

    async def passage(self) -> None:
        """Return at once when open; otherwise wait (counted in `waiting`) until opened."""
        if self._open.is_set():
            return
        self.waiting += 1
        self._on_change()
        try:
            await self._open.wait()
        finally:
            self.waiting -= 1
            self._on_change()
