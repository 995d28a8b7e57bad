"""Over-share detection: a pod using more GPU memory than its share, for longer than allowed.

Nothing on a time-sliced GPU stops one pod from taking the memory the others were promised, so
the plugin says so instead: a pod whose processes use more of a shared device than the
replicas it holds there entitle it to (see `usage.report`), continuously for `after_s` seconds,
is reported once, as a value the daemon turns into Warning Events. It is reported again only
after it has come back within its share. Nothing is killed.

Only shared devices (some resource gives them more than one replica) count: a pod holding a
whole GPU or MIG device is entitled to all of it. A pod that uses a shared device it holds no
replica of has a share of 0 there. The tracker holds no clock: the caller passes `now` (the
loop's clock), and `next_deadline` says when a pod already over its share would cross the
threshold, so the caller can look again then instead of on a timer.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sharing_plugin.gpus.inventory import GpuUuid
from sharing_plugin.usage.model import UsageSnapshot


@dataclass(frozen=True, slots=True)
class PodOnDevice:
    """What one pod uses of one shared device, and its share there."""

    namespace: str
    pod: str
    device: str
    gpu: GpuUuid
    index: str
    mig: str
    resource: str
    replicas: int
    memory: int
    share: int

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.namespace, self.pod, self.device)

    @property
    def over(self) -> bool:
        return self.memory > self.share


@dataclass(frozen=True, slots=True)
class Exceeded:
    """A pod over its share of a device since `since`, for at least the allowed time."""

    usage: PodOnDevice
    since: float


def pods_on_shared_devices(report: UsageSnapshot) -> list[PodOnDevice]:
    """Attributed usage summed per pod and shared device (containers of one pod together)."""
    out: dict[tuple[str, str, str], PodOnDevice] = {}
    for device in report.devices():
        if not device.shared:
            continue
        for c in device.containers:
            if not c.attributed:
                continue
            key = (c.holder.namespace, c.holder.pod, device.uuid)
            before = out.get(key)
            out[key] = PodOnDevice(
                namespace=c.holder.namespace,
                pod=c.holder.pod,
                device=device.uuid,
                gpu=device.gpu,
                index=device.index,
                mig=device.mig,
                resource=(before.resource if before and before.resource else c.resource),
                replicas=(before.replicas if before else 0) + len(c.replicas),
                memory=(before.memory if before else 0) + c.memory,
                share=(before.share if before else 0) + c.share,
            )
    return list(out.values())


class OverShareTracker:
    """Remembers since when each pod has been over its share; see the module doc."""

    def __init__(self, *, after_s: float) -> None:
        self.after_s = after_s
        self._since: dict[tuple[str, str, str], float] = {}
        self._reported: set[tuple[str, str, str]] = set()
        self._latest: dict[tuple[str, str, str], PodOnDevice] = {}

    def observe(self, usage: Iterable[PodOnDevice], now: float) -> list[Exceeded]:
        """Take the latest usage; returns the pods that just passed `after_s` over their share."""
        over = {u.key: u for u in usage if u.over}
        for key in list(self._since):
            if key not in over:  # back within its share, or gone: forget the episode
                del self._since[key]
                self._reported.discard(key)
        self._latest = over
        newly = []
        for key, u in over.items():
            since = self._since.setdefault(key, now)
            if key not in self._reported and now - since >= self.after_s:
                self._reported.add(key)
                newly.append(Exceeded(usage=u, since=since))
        return newly

    def exceeded(self) -> list[PodOnDevice]:
        """The pods reported and still over their share (what the gauge counts)."""
        return [self._latest[k] for k in sorted(self._reported) if k in self._latest]

    def next_deadline(self) -> float | None:
        """When the first pod over its share, not yet reported, crosses the threshold."""
        pending = [t + self.after_s for k, t in self._since.items() if k not in self._reported]
        return min(pending) if pending else None
