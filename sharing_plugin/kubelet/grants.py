"""Devices that Allocate handed out and kubelet's PodResources may not list yet.

Kubelet records which devices a container holds only once our Allocate answer has reached it
(devicemanager `allocateContainerResources` inserts into `podDevices` after the call returns), so
a PodResources answer asked for a moment earlier does not list them. A reload that dropped such a
device would make it vanish from ListAndWatch while a pod holds it: capacity would lie. So the
resource servers note every grant here, and the supervisor counts a grant as held until a
PodResources answer can speak for it:

- an answer asked for after the grant lists the device: kubelet has it, PodResources is the
  authority from now on (only the pod that got it can hold it, kubelet never hands out a held
  device twice);
- an answer asked for `record_window_s` or more after the grant does not list it: the pod is
  gone already, or kubelet never recorded it (the pod failed admission for another reason).

A grant of a device that the resource no longer advertised (kubelet picked it from the list it
had a moment before a reload) is "late": kubelet is told nothing about it until the supervisor
advertises it again, as draining, so `on_late` asks for that at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Iterable, Mapping

from sharing_plugin.plan import VirtualDevice

# Kubelet records a grant microseconds after our answer arrives; two seconds covers a kubelet
# starved of CPU. Too long costs little: a device the config dropped and a pod released at once
# stays advertised Unhealthy that much longer.
RECORD_WINDOW_S = 2.0


class GrantLedger:
    """Recent grants per (resource, device ID), with the loop time of the latest one."""

    def __init__(
        self,
        *,
        record_window_s: float = RECORD_WINDOW_S,
        on_late: Callable[[], None] | None = None,
    ) -> None:
        self._window = record_window_s
        self._on_late = on_late
        self._grants: dict[tuple[str, str], tuple[VirtualDevice, float]] = {}
        self._next_prune = 0.0

    def __len__(self) -> int:
        return len(self._grants)

    @staticmethod
    def now() -> float:
        return asyncio.get_running_loop().time()

    def record(
        self, resource: str, devices: Iterable[VirtualDevice], *, late: bool = False
    ) -> None:
        """Note that `devices` of `resource` were just handed out by Allocate."""
        now = self.now()
        for device in devices:
            self._grants[(resource, device.id)] = (device, now)
        if now >= self._next_prune:
            # Whatever is older than the window is settled by any answer asked from now on;
            # pruning here keeps the ledger small on a node that never reloads.
            self._prune(lambda granted_at: granted_at + self._window <= now)
            self._next_prune = now + self._window
        if late and self._on_late is not None:
            self._on_late()

    def settle(self, held: Mapping[str, Collection[str]] | None, *, asked_at: float) -> None:
        """Forget the grants that a PodResources answer asked for at `asked_at` speaks for.

        `held` is that answer (resource -> IDs pods hold), None when kubelet could not tell:
        then only the grants older than the window go.
        """
        expired = asked_at - self._window
        for key, (_, granted_at) in list(self._grants.items()):
            listed = held is not None and key[1] in held.get(key[0], ())
            if granted_at <= expired or (listed and granted_at < asked_at):
                del self._grants[key]

    def outstanding(self) -> dict[str, tuple[VirtualDevice, ...]]:
        """Per resource, the granted devices that PodResources cannot vouch for yet."""
        result: dict[str, list[VirtualDevice]] = {}
        for (resource, _), (device, _) in self._grants.items():
            result.setdefault(resource, []).append(device)
        return {resource: tuple(devices) for resource, devices in result.items()}

    def _prune(self, old: Callable[[float], bool]) -> None:
        for key in [k for k, (_, granted_at) in self._grants.items() if old(granted_at)]:
            del self._grants[key]
