"""Claims that hold a shared GPU at another share than the config's now.

A device published by capacity gives each claim that asks nothing one replica's share of its
memory. An edit of `replicas` changes the share (a 15 GiB T4 at 4 replicas: 3840 MiB, at 5:
3072 MiB), but memory is never promised twice: claims keep what they were placed with, and the
new share applies to new claims only, so raising replicas on a full GPU admits nobody until a
claim placed at the old share is released (each release frees its old share, into which as
many new shares fit as it holds). The edit takes full effect once no claim holds an old share;
until then the device is listed here, for `/status` and the log, and the Node hears of it
(`shares_notice`): an event when a device starts waiting, and one when none waits any more.
Everything here is pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import groupby

from sharing_plugin.views.dra import DraDevice
from sharing_plugin.views.dra_api import PublishedDevice, quantity_mib


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


def old_shares(
    devices: Iterable[DraDevice], held: Sequence[PublishedDevice]
) -> tuple[OldShares, ...]:
    """The devices of `devices` published by capacity that claims hold at another share.

    `held` has one entry per share a prepared claim holds: what was published for its device
    when the claim was prepared (its request policy's default is the share it was placed at).
    """
    found: list[OldShares] = []
    for device in devices:
        if device.shares is None:
            continue
        placed = [_share_mib(p) for p in held if p.name == device.name]
        others = [mib for mib in placed if mib != device.shares.mib]
        old = len(others)
        if not old:
            continue
        held_mib = sum(mib if mib is not None else device.shares.mib for mib in placed)
        found.append(
            OldShares(
                device=device.name,
                uuid=device.device.physical,
                share_mib=device.shares.mib,
                shares=device.shares.count,
                old_claims=old,
                held_mib=held_mib,
                fit_now=max(device.memory_mib - held_mib, 0) // max(device.shares.mib, 1),
                old_mib=tuple(sorted({mib for mib in others if mib is not None})),
            )
        )
    return tuple(found)


def _share_mib(published: PublishedDevice) -> int | None:
    memory = published.capacity.get("memory")
    if memory is None or memory.default is None:
        return None
    return quantity_mib(memory.default)


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
