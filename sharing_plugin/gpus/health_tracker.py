"""GPU health as a state machine: Xid and ECC events, lost GPUs and recovery checks in, changes
out.

Everything here is a value or a plain method call with the time passed in, so the rules can be
tested without NVML, threads or an event loop; the caller owns the clock, performs the NVML
queries `due_checks` asks for and reports back through `on_check`.

The rules:

- An Xid that the `XidPolicy` counts as critical marks the device it names Unhealthy: a GPU
  UUID stands for the GPU and everything on it, a MIG UUID for that MIG device only. An event
  naming no known device marks every GPU (the reference plugin does the same when it cannot
  tell which GPU an event came from).
- A double-bit ECC error (uncorrectable: data in GPU memory is wrong) marks the GPU it names
  Unhealthy whatever the Xid policy says: it is not an Xid, so ignored Xids do not apply. The
  reference plugin registers for ECC events but drops every event that is not an Xid (the
  driver also reports such an error as Xid 48, which it counts); counting the ECC event itself
  keeps the GPU out of service when Xid 48 is ignored, not in criticalXIDs, or not watched. A
  single-bit ECC error was corrected by the hardware: it is reported and changes nothing, as in
  the reference.
- A lost GPU (NVML answers GPU_IS_LOST, or stops answering) is Unhealthy.
- Each Unhealthy device keeps the fault that made it so (`faults`): the first one, until it
  recovers, so what other systems are told about it does not change with every repeat.
- Recovery: the reference plugin never brings a device back. Here an Unhealthy device is
  checked first `first_check_s` after it failed, then with a doubling delay up to `max_check_s`
  while NVML does not answer. It is Healthy again once NVML answers normally and no fault
  (critical Xid, double-bit ECC error, lost, failed check) was seen for `quiet_period_s`: a GPU
  that answers once between two faults is not trusted with pods yet.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from sharing_plugin.gpus.inventory import Inventory


@dataclass(frozen=True, slots=True)
class XidPolicy:
    """Which Xids mean a faulty GPU.

    `ignored` are application errors (the config's ``health.ignoredXids``). When `only` is set,
    just those Xids count and every other is ignored: the reference plugin's
    ``DP_DISABLE_HEALTHCHECKS=all`` together with ``DP_ENABLE_HEALTHCHECKS=<xids>``.
    """

    ignored: frozenset[int] = frozenset()
    only: frozenset[int] | None = None

    def is_critical(self, xid: int) -> bool:
        if self.only is not None:
            return xid in self.only
        return xid not in self.ignored


class EventKind(StrEnum):
    """What an NVML health event reports (the config's ``health.eventTypes``, in our words)."""

    XID = "xid"
    DOUBLE_BIT_ECC = "double-bit-ecc"
    SINGLE_BIT_ECC = "single-bit-ecc"


EVERY_EVENT_KIND = frozenset(EventKind)
"""What is watched when the config names no event types: all three, as in the reference."""


@dataclass(frozen=True, slots=True)
class RecoveryTiming:
    """When an Unhealthy device is checked again and how long it must stay quiet to recover."""

    quiet_period_s: float = 60.0
    first_check_s: float = 30.0
    max_check_s: float = 300.0

    def __post_init__(self) -> None:
        if self.quiet_period_s < 0 or self.first_check_s <= 0:
            raise ValueError("recovery timing: quiet period >= 0 and first check > 0 needed")
        if self.max_check_s < self.first_check_s:
            raise ValueError("recovery timing: the longest check delay is below the first one")


class Cause(StrEnum):
    """Why health changed."""

    XID = "xid"
    UNATTRIBUTED_XID = "unattributed-xid"
    DOUBLE_BIT_ECC = "double-bit-ecc"
    LOST = "lost"
    RECOVERED = "recovered"
    RESET = "reset"  # health checking turned off: everything is Healthy again


_REASONS = {
    Cause.XID: "xid",
    Cause.UNATTRIBUTED_XID: "xid",
    Cause.DOUBLE_BIT_ECC: "ecc-double",
    Cause.LOST: "lost",
}


@dataclass(frozen=True, slots=True)
class Fault:
    """Why a device is Unhealthy: the cause, the Xid of an Xid fault, and NVML's words."""

    cause: Cause
    xid: int | None = None
    detail: str = ""

    @property
    def reason(self) -> str:
        """A short code of the fault, the same for every repeat of it: `xid-79`, `ecc-double`,
        `lost`."""
        code = _REASONS.get(self.cause, str(self.cause))
        return f"{code}-{self.xid}" if self.xid is not None else code

    def describe(self) -> str:
        """One phrase for people: `Xid 79`, `double-bit ECC error ...`, `lost: <detail>`."""
        if self.cause is Cause.LOST:
            return f"lost: {self.detail}" if self.detail else "lost"
        return self.detail or self.reason


@dataclass(frozen=True, slots=True)
class HealthChange:
    """Devices (GPU or MIG UUIDs) whose health just flipped, all the same way, and why."""

    devices: tuple[str, ...]
    healthy: bool
    cause: Cause
    xid: int | None = None
    message: str = ""  # one log line for the admin, naming the devices


@dataclass(slots=True)
class _Outage:
    fault: Fault
    last_fault: float
    next_check: float
    delay: float


class HealthTracker:
    """The health of every GPU and MIG device of one inventory; all start Healthy."""

    def __init__(
        self,
        inventory: Inventory,
        *,
        policy: XidPolicy | None = None,
        timing: RecoveryTiming | None = None,
    ) -> None:
        self.policy = policy if policy is not None else XidPolicy()
        self.timing = timing if timing is not None else RecoveryTiming()
        self._inventory = inventory
        self._outages: dict[str, _Outage] = {}

    # ---- what is known ----

    @property
    def inventory(self) -> Inventory:
        return self._inventory

    @property
    def health(self) -> Mapping[str, bool]:
        """Every GPU and MIG UUID of the inventory -> Healthy (True) or not."""
        result: dict[str, bool] = {}
        for gpu in self._inventory.gpus:
            result[gpu.uuid] = gpu.uuid not in self._outages
            for mig in gpu.mig_devices:
                result[mig.uuid] = mig.uuid not in self._outages
        return result

    @property
    def unhealthy(self) -> frozenset[str]:
        return frozenset(self._outages)

    @property
    def faults(self) -> Mapping[str, Fault]:
        """Every Unhealthy GPU or MIG UUID -> the fault that made it Unhealthy."""
        return {uuid: outage.fault for uuid, outage in self._outages.items()}

    def next_deadline(self) -> float | None:
        """When the earliest recovery check is due; None when every device is Healthy."""
        return min((o.next_check for o in self._outages.values()), default=None)

    def due_checks(self, now: float) -> list[str]:
        """Unhealthy devices whose recovery check is due at `now`, in UUID order."""
        return sorted(uuid for uuid, o in self._outages.items() if o.next_check <= now)

    # ---- inputs ----

    def on_xid(self, uuid: str | None, xid: int, now: float) -> HealthChange | None:
        """An Xid on `uuid` (None: NVML could not say which device)."""
        if not self.policy.is_critical(xid):
            return None
        if uuid is not None and self._known(uuid):
            return self._fail((uuid,), now, Cause.XID, xid, f"Xid {xid}")
        every_gpu = tuple(g.uuid for g in self._inventory.gpus)
        source = "an unknown device" if uuid is None else f"unknown device {uuid}"
        return self._fail(
            every_gpu,
            now,
            Cause.UNATTRIBUTED_XID,
            xid,
            f"Xid {xid} from {source}, which cannot be attributed to one GPU",
        )

    def on_ecc(self, uuid: str | None, kind: EventKind, now: float) -> HealthChange | None:
        """An ECC event on `uuid` (None: NVML could not say which GPU). Only a double-bit
        error changes health; the Xid policy does not apply to it."""
        if kind is EventKind.XID:
            raise ValueError("on_ecc: an Xid goes to on_xid")
        if kind is EventKind.SINGLE_BIT_ECC:
            return None
        why = "double-bit ECC error (uncorrectable memory error)"
        if uuid is not None and self._known(uuid):
            return self._fail((uuid,), now, Cause.DOUBLE_BIT_ECC, None, why)
        source = "an unknown device" if uuid is None else f"unknown device {uuid}"
        every_gpu = tuple(g.uuid for g in self._inventory.gpus)
        return self._fail(
            every_gpu,
            now,
            Cause.DOUBLE_BIT_ECC,
            None,
            f"{why} from {source}, which cannot be attributed to one GPU",
        )

    def on_lost(
        self, uuid: str | None, now: float, *, detail: str = "NVML does not answer"
    ) -> HealthChange | None:
        """A device that stopped answering NVML (e.g. GPU_IS_LOST); None: every GPU (NVML
        itself failed, so no GPU's health can be known)."""
        if uuid is not None and self._known(uuid):
            targets: tuple[str, ...] = (uuid,)
        else:
            targets = tuple(g.uuid for g in self._inventory.gpus)
        return self._fail(targets, now, Cause.LOST, None, detail)

    def on_check(self, uuid: str, answered: bool, now: float) -> HealthChange | None:
        """The result of the recovery check `due_checks` asked for."""
        outage = self._outages.get(uuid)
        if outage is None:
            return None
        if not answered:
            outage.last_fault = now
            outage.delay = min(outage.delay * 2, self.timing.max_check_s)
            outage.next_check = now + outage.delay
            return None
        quiet_until = outage.last_fault + self.timing.quiet_period_s
        if now < quiet_until:
            outage.next_check = quiet_until
            return None
        del self._outages[uuid]
        return HealthChange(
            devices=(uuid,),
            healthy=True,
            cause=Cause.RECOVERED,
            message=(
                f"{self._name(uuid)} is Healthy again: NVML answers and no fault was seen "
                f"for {self.timing.quiet_period_s:g}s"
            ),
        )

    def reset(self) -> HealthChange | None:
        """Forget every outage (health checking turned off): all devices are Healthy."""
        devices = tuple(sorted(self._outages))
        self._outages.clear()
        if not devices:
            return None
        return HealthChange(
            devices=devices,
            healthy=True,
            cause=Cause.RESET,
            message=f"health checks are off: {self._names(devices)} reported Healthy again",
        )

    def use_inventory(self, inventory: Inventory) -> None:
        """Follow a new inventory (e.g. after a MIG change); outages of vanished devices end."""
        self._inventory = inventory
        for uuid in [u for u in self._outages if not self._known(u)]:
            del self._outages[uuid]

    # ---- internals ----

    def _fail(
        self, targets: Iterable[str], now: float, cause: Cause, xid: int | None, why: str
    ) -> HealthChange | None:
        newly: list[str] = []
        for uuid in targets:
            outage = self._outages.get(uuid)
            if outage is None:
                first = self.timing.first_check_s
                self._outages[uuid] = _Outage(
                    fault=Fault(cause, xid, why),
                    last_fault=now,
                    next_check=now + first,
                    delay=first,
                )
                newly.append(uuid)
            else:
                outage.last_fault = now  # postpones recovery; the check schedule stays
        if not newly:
            return None
        return HealthChange(
            devices=tuple(newly),
            healthy=False,
            cause=cause,
            xid=xid,
            message=f"{self._names(newly)} marked Unhealthy, with every device it backs: {why}",
        )

    def _known(self, uuid: str) -> bool:
        inventory = self._inventory
        return inventory.gpu(uuid) is not None or inventory.mig_device(uuid) is not None

    def _names(self, uuids: Iterable[str]) -> str:
        return ", ".join(self._name(u) for u in uuids)

    def _name(self, uuid: str) -> str:
        gpu = self._inventory.gpu(uuid)
        if gpu is not None:
            return f"GPU {gpu.index} ({uuid})"
        mig = self._inventory.mig_device(uuid)
        if mig is not None:
            return f"MIG device {mig.profile} on GPU {mig.parent_index} ({uuid})"
        return uuid
