"""Claims that hold a shared GPU at another share than the config's now.

A device published by capacity gives each claim that asks nothing one replica's share of its
memory, and a claim that asks memory its request rounded up to whole shares. An edit of
`replicas` changes the share (a 15 GiB T4 at 4 replicas: 3840 MiB, at 5: 3072 MiB), but memory
is never promised twice: claims keep what they consumed, and the new share applies to new claims
only, so raising replicas on a full GPU admits nobody until an old claim is released.

The rule, counted per share a claim holds (one per allocation result, from what its allocation
consumed, `consumedCapacity.memory`):

- a share is *old* when the memory it consumed is not what the same request gets under the
  config now: one share for a request that asked nothing, the request rounded up to whole
  shares otherwise. Those are the claims that must go before the edit takes full effect. A
  claim that asked 40 GiB of an 80 GiB GPU holds 2 shares at 4 replicas and 4 at 8 replicas
  (not old at 8: a new claim asking 40 GiB gets the same), but 40 GiB is no whole number of
  16 GiB shares (5 replicas: old). A claim that asked nothing and holds 20 GiB is old at 8
  replicas: a claim asking nothing gets 10 GiB now.
- `heldMiB` is what every share held on the device consumed, old or not; `fitNow` how many of
  the config's shares fit in the rest of the device's memory.

A share prepared by an earlier version, whose checkpoint entry has no consumed memory, counts
at the share it was placed with and as a claim that asked nothing (what was known then).
The edit takes full effect once no share is old; until then the device is listed here, for
`/status` and the log, and the Node hears of it (`shares_notice`): an event when a device starts
waiting, and one when none waits any more. Everything here is pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import groupby

from sharing_plugin.views.dra import DraDevice
from sharing_plugin.views.dra_api import PublishedDevice, quantity_mib


@dataclass(frozen=True, slots=True)
class HeldShare:
    """A share of a device a prepared claim holds (one allocation result)."""

    device: str  # the device's name
    placed_mib: int | None  # the device's share when the claim was prepared (None: not shared)
    consumed_mib: int | None = None  # what the allocation consumed; None: not recorded
    asked_mib: int | None = None  # what the request asked; None: nothing (the default share)

    @property
    def held_mib(self) -> int | None:
        """What the share takes of the device: what it consumed, else the share it was placed
        with (an entry of an earlier version)."""
        return self.consumed_mib if self.consumed_mib is not None else self.placed_mib


def held_share(
    published: PublishedDevice, *, consumed_mib: int | None = None, asked_mib: int | None = None
) -> HeldShare:
    """A share of a device as it was published when the claim was prepared (its request
    policy's default is the share the claim was placed at)."""
    memory = published.capacity.get("memory")
    placed = quantity_mib(memory.default) if memory is not None and memory.default else None
    return HeldShare(published.name, placed, consumed_mib, asked_mib)


def granted_mib(asked_mib: int | None, share_mib: int) -> int:
    """What a request gets of a device whose share is `share_mib` (its request policy: default,
    min and step one share): one share when it asks nothing or less, else the request rounded
    up to whole shares."""
    if asked_mib is None or asked_mib <= share_mib:
        return share_mib
    return -(-asked_mib // share_mib) * share_mib


@dataclass(frozen=True, slots=True)
class OldShares:
    """A shared device some claims hold at another share than the config's now."""

    device: str
    uuid: str
    share_mib: int  # the config's share now
    shares: int  # the config's replicas now
    old_claims: int  # shares held at another size
    held_mib: int  # what every share held takes
    fit_now: int  # new shares that fit in what is free now
    old_mib: tuple[int, ...] = ()  # the other sizes claims hold shares at, ascending

    def message(self) -> str:
        return (
            f"{self.uuid} ({self.device}): {self.old_claims} claim share(s) placed at another "
            f"share size hold {self.held_mib} MiB in all; {self.fit_now} of the {self.shares} "
            f"shares of {self.share_mib} MiB fit now, the rest as those claims are released"
        )

    def to_json(self) -> dict[str, object]:
        return {
            "device": self.device,
            "uuid": self.uuid,
            "shareMiB": self.share_mib,
            "shares": self.shares,
            "oldShareClaims": self.old_claims,
            "heldMiB": self.held_mib,
            "fitNow": self.fit_now,
        }


def old_shares(devices: Iterable[DraDevice], held: Sequence[HeldShare]) -> tuple[OldShares, ...]:
    """The devices of `devices` published by capacity that claims hold at another share (the
    rule in the module docstring); `held` has one entry per share a prepared claim holds."""
    found: list[OldShares] = []
    for device in devices:
        if device.shares is None:
            continue
        share = device.shares.mib
        on_it = [h for h in held if h.device == device.name]
        old = [h for h in on_it if _old(h, share)]
        if not old:
            continue
        held_mib = sum(h.held_mib if h.held_mib is not None else share for h in on_it)
        found.append(
            OldShares(
                device=device.name,
                uuid=device.device.physical,
                share_mib=share,
                shares=device.shares.count,
                old_claims=len(old),
                held_mib=held_mib,
                fit_now=max(device.memory_mib - held_mib, 0) // max(share, 1),
                old_mib=tuple(sorted({h.placed_mib for h in old if h.placed_mib is not None})),
            )
        )
    return tuple(found)


def _old(held: HeldShare, share_mib: int) -> bool:
    """Whether a share holds other memory than its request gets at `share_mib` now."""
    if held.held_mib is None:  # placed when the device was not shared by capacity
        return True
    return held.held_mib != granted_mib(held.asked_mib, share_mib)


WAITS_FOR_CLAIMS = "ConfigWaitsForClaims"
FULLY_APPLIED = "ConfigFullyApplied"


@dataclass(frozen=True, slots=True)
class SharesNotice:
    """The Node event a change of what waits for claims deserves."""

    reason: str
    message: str
    warning: bool


def shares_notice(before: Sequence[OldShares], after: Sequence[OldShares]) -> SharesNotice | None:
    """What to tell the Node when the devices waiting for claims go from `before` to `after`.

    A device that starts waiting, or waits for another share than before (a second edit), is
    a new situation: a Warning names every device waiting now, since pods asking the new
    shares may stay Pending until then. Claims going while others still wait change only
    the counts (`/status` follows them): nothing, so an admin is told once per edit, not at
    every release. The last one going: a Normal event that the edit took full effect.
    """
    was = {(o.device, o.share_mib) for o in before}
    now = {(o.device, o.share_mib) for o in after}
    if now - was:
        return SharesNotice(WAITS_FOR_CLAIMS, _waiting(after), warning=True)
    if was and not now:
        return SharesNotice(
            FULLY_APPLIED,
            "dra.sharedDevices capacity: no claim holds a share of another size than the "
            "config's any more; the replicas edit has taken full effect",
            warning=False,
        )
    return None


def _waiting(found: Sequence[OldShares]) -> str:
    """Devices grouped by what they wait for, each group with its claims and what fits now."""

    def key(o: OldShares) -> tuple[tuple[int, ...], int, int]:
        return o.old_mib, o.share_mib, o.shares

    groups = []
    for (old, share, count), members in groupby(sorted(found, key=key), key=key):
        same = list(members)
        sizes = "/".join(str(mib) for mib in old)
        held = f"the old share ({sizes} MiB)" if old else "a share of another size"
        claims = sum(o.old_claims for o in same)
        groups.append(
            f"{', '.join(o.uuid for o in same)}: {claims} claim(s) hold {held}, "
            f"the config's share is {share} MiB ({count} per device), "
            f"{sum(o.fit_now for o in same)} new share(s) fit now"
        )
    return (
        "dra.sharedDevices capacity: the replicas edit takes full effect as the claims holding "
        "the old share are released (see /status dra.oldShares): " + "; ".join(groups)
    )
