"""Claims that hold a shared GPU at another share than the config's now.

A device published by capacity gives each claim that asks nothing one replica's share of its
memory. An edit of `replicas` changes the share (a 15 GiB T4 at 4 replicas: 3840 MiB, at 5:
3072 MiB), but memory is never promised twice: claims keep what they were placed with, and the
new share applies to new claims only, so raising replicas on a full GPU admits nobody until a
claim placed at the old share is released (each release frees its old share, into which as
many new shares fit as it holds). The edit takes full effect once no claim holds an old share;
until then the device is listed here, for `/status` and the log. Everything here is pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

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
        old = sum(1 for mib in placed if mib != device.shares.mib)
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
            )
        )
    return tuple(found)


def _share_mib(published: PublishedDevice) -> int | None:
    memory = published.capacity.get("memory")
    if memory is None or memory.default is None:
        return None
    return quantity_mib(memory.default)
