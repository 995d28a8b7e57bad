"""Raising replicas on a shared GPU whose claims hold the old share: what fits, and when."""

from __future__ import annotations

from sharing_plugin.backends import backend_from_spec
from sharing_plugin.config.model import Config
from sharing_plugin.nvml.discover import discover
from sharing_plugin.plan import plan
from sharing_plugin.views.dra import DraDevice, dra_devices
from sharing_plugin.views.dra_shares import (
    HeldShare,
    granted_mib,
    held_share,
    old_shares,
    shares_notice,
)

T4 = discover(backend_from_spec("simulated:t4x4"))  # 15360 MiB each


def placed(device: DraDevice, count: int = 1) -> list[HeldShare]:
    """`count` claims that asked nothing placed at `device`'s share, as a checkpoint of an
    earlier version tells them (nothing consumed recorded)."""
    return [held_share(device.published())] * count


def gpu0(replicas: int) -> DraDevice:
    config = Config.model_validate(
        {
            "version": "v1",
            "sharing": {
                "timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": replicas}]}
            },
        }
    )
    devices = dra_devices(plan(config, T4), T4)
    return next(d for d in devices if d.device.gpu_uuid == T4.gpus[0].uuid)


def test_raising_replicas_on_a_full_gpu_fits_nothing_until_an_old_claim_goes() -> None:
    at4, at5 = gpu0(4), gpu0(5)
    assert at4.shares is not None and at4.shares.mib == 3840
    assert at5.shares is not None and at5.shares.mib == 3072
    held = placed(at4, 4)  # four claims placed at 4 replicas: the GPU is full
    (full,) = old_shares([at5], held)
    assert (full.old_claims, full.held_mib, full.fit_now, full.shares) == (4, 15360, 0, 5)
    assert "0 of the 5 shares of 3072 MiB fit now" in full.message()
    # One old claim released: its 3840 MiB take one new share.
    (one,) = old_shares([at5], held[:3])
    assert (one.old_claims, one.fit_now) == (3, 1)
    # Claims placed at 5 replicas are at the config's share: nothing waits.
    assert old_shares([at5], placed(at5, 5)) == ()
    assert old_shares([at4], held) == ()


def test_lowering_replicas_waits_for_the_claims_placed_at_the_smaller_share() -> None:
    at5, at4 = gpu0(5), gpu0(4)
    (waiting,) = old_shares([at4], placed(at5, 5))
    assert (waiting.old_claims, waiting.held_mib, waiting.fit_now) == (5, 15360, 0)
    (later,) = old_shares([at4], placed(at5, 3))
    assert later.fit_now == 1  # 6144 MiB free: one share of 3840


def test_the_node_hears_when_a_device_starts_waiting_and_when_none_waits_any_more() -> None:
    at4, at5, at8 = gpu0(4), gpu0(5), gpu0(8)
    held = placed(at4, 4)
    full = old_shares([at5], held)
    assert full[0].old_mib == (3840,)
    waits = shares_notice((), full)
    assert waits is not None and waits.reason == "ConfigWaitsForClaims" and waits.warning
    assert (
        f"{T4.gpus[0].uuid}: 4 claim(s) hold the old share (3840 MiB), the config's share is "
        "3072 MiB (5 per device), 0 new share(s) fit now"
    ) in waits.message
    assert shares_notice(full, full) is None
    # A release while claims still wait changes the counts only.
    assert shares_notice(full, old_shares([at5], held[:2])) is None
    # Another edit while they wait: a new share to wait for, said again, with both old sizes.
    mixed = old_shares([at8], [*held[:2], *placed(at5)])
    assert mixed[0].old_mib == (3072, 3840)
    again = shares_notice(full, mixed)
    assert again is not None and "the old share (3072/3840 MiB)" in again.message
    done = shares_notice(mixed, ())
    assert done is not None and done.reason == "ConfigFullyApplied" and not done.warning
    assert shares_notice((), ()) is None


def consumed(device: DraDevice, mib: int, asked: int | None = None) -> HeldShare:
    """A share of `device` placed at its share now, that consumed `mib` and asked `asked`."""
    return held_share(device.published(), consumed_mib=mib, asked_mib=asked)


def test_a_claim_counts_the_memory_it_consumed_not_the_share_it_was_placed_at() -> None:
    at4, at5 = gpu0(4), gpu0(5)
    # Two claims that asked 7 GiB each at 4 replicas: two shares of 3840 MiB each, the GPU full.
    held = [consumed(at4, 7680, asked=7168)] * 2
    (full,) = old_shares([at5], held)
    assert (full.old_claims, full.held_mib, full.fit_now, full.old_mib) == (2, 15360, 0, (3840,))
    # One of them and one that asked nothing: 11520 MiB held, one new share fits.
    (one,) = old_shares([at5], [held[0], consumed(at4, 3840)])
    assert (one.old_claims, one.held_mib, one.fit_now) == (2, 11520, 1)
    # Placed at 5 replicas, asking 5 GiB: two shares of 3072 MiB, what it gets now: not old,
    # but its memory is held (with an old claim beside it: 6144 + 3840 of 15360, 1 fits).
    assert old_shares([at5], [consumed(at5, 6144, asked=5120)]) == ()
    (beside,) = old_shares([at5], [consumed(at5, 6144, asked=5120), consumed(at4, 3840)])
    assert (beside.old_claims, beside.held_mib, beside.fit_now) == (1, 9984, 1)


def test_a_claim_is_old_when_its_request_gets_other_memory_now() -> None:
    at4, at8 = gpu0(4), gpu0(8)  # 3840 and 1920 MiB a share
    assert granted_mib(None, 1920) == 1920
    assert granted_mib(1000, 1920) == 1920  # less than a share: one share
    assert granted_mib(7168, 1920) == 7680  # rounded up to whole shares
    # Asked 7 GiB at 4 replicas: 7680 MiB, two shares of 3840 or four of 1920: what a claim
    # asking 7 GiB gets at 8 replicas too, so nothing waits for it.
    assert old_shares([at8], [consumed(at4, 7680, asked=7168)]) == ()
    # Asked nothing at 4 replicas, holding 3840 MiB: a claim asking nothing gets 1920 now.
    (waits,) = old_shares([at8], [consumed(at4, 3840)])
    assert (waits.old_claims, waits.held_mib, waits.fit_now) == (1, 3840, 6)
    # Asked 5 GiB at 8 replicas (three shares, 5760 MiB): back at 4 it would get 7680.
    (back,) = old_shares([at4], [consumed(at8, 5760, asked=5120)])
    assert (back.old_claims, back.held_mib, back.fit_now, back.old_mib) == (1, 5760, 2, (1920,))


def test_an_entry_without_consumed_memory_counts_at_the_share_it_was_placed_at() -> None:
    at4, at5 = gpu0(4), gpu0(5)
    (old,) = old_shares([at5], [held_share(at4.published()), consumed(at4, 7680, asked=7168)])
    assert (old.old_claims, old.held_mib, old.fit_now) == (2, 11520, 1)
    assert old_shares([at4], placed(at4, 4)) == ()
