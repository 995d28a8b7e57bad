"""Raising replicas on a shared GPU whose claims hold the old share: what fits, and when."""

from __future__ import annotations

from sharing_plugin.backends import backend_from_spec
from sharing_plugin.config.model import Config
from sharing_plugin.nvml.discover import discover
from sharing_plugin.plan import plan
from sharing_plugin.views.dra import DraDevice, dra_devices
from sharing_plugin.views.dra_shares import old_shares, shares_notice

T4 = discover(backend_from_spec("simulated:t4x4"))  # 15360 MiB each


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
    held = [at4.published()] * 4  # four claims placed at 4 replicas: the GPU is full
    (full,) = old_shares([at5], held)
    assert (full.old_claims, full.held_mib, full.fit_now, full.shares) == (4, 15360, 0, 5)
    assert "0 of the 5 shares of 3072 MiB fit now" in full.message()
    # One old claim released: its 3840 MiB take one new share.
    (one,) = old_shares([at5], held[:3])
    assert (one.old_claims, one.fit_now) == (3, 1)
    # Claims placed at 5 replicas are at the config's share: nothing waits.
    assert old_shares([at5], [at5.published()] * 5) == ()
    assert old_shares([at4], held) == ()


def test_lowering_replicas_waits_for_the_claims_placed_at_the_smaller_share() -> None:
    at5, at4 = gpu0(5), gpu0(4)
    (waiting,) = old_shares([at4], [at5.published()] * 5)
    assert (waiting.old_claims, waiting.held_mib, waiting.fit_now) == (5, 15360, 0)
    (later,) = old_shares([at4], [at5.published()] * 3)
    assert later.fit_now == 1  # 6144 MiB free: one share of 3840


def test_the_node_hears_when_a_device_starts_waiting_and_when_none_waits_any_more() -> None:
    at4, at5, at8 = gpu0(4), gpu0(5), gpu0(8)
    held = [at4.published()] * 4
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
    mixed = old_shares([at8], [*held[:2], at5.published()])
    assert mixed[0].old_mib == (3072, 3840)
    again = shares_notice(full, mixed)
    assert again is not None and "the old share (3072/3840 MiB)" in again.message
    done = shares_notice(mixed, ())
    assert done is not None and done.reason == "ConfigFullyApplied" and not done.warning
    assert shares_notice((), ()) is None
