"""A claim's allocation as prepare reads it (what each share consumed and its request asked),
and a prepared claim as the checkpoint keeps it, across versions of the file."""

from __future__ import annotations

from typing import Any

import pytest

from sharing_plugin.dra.checkpoint import PreparedClaim
from sharing_plugin.dra.claims import claim_from_document

DRIVER = "gpu.sharing-plugin.io"


def result(request: str, memory: str | None = None) -> dict[str, Any]:
    found: dict[str, Any] = {"request": request, "driver": DRIVER, "pool": "n", "device": "g"}
    if memory is not None:
        found |= {"shareID": f"share-{request}", "consumedCapacity": {"memory": memory}}
    return found


def test_each_result_keeps_what_it_consumed_and_what_its_request_asked() -> None:
    claim = claim_from_document(
        {
            "metadata": {"namespace": "ns", "name": "c", "uid": "u"},
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "plain", "exactly": {"deviceClassName": "x"}},
                        {
                            "name": "big",
                            "exactly": {
                                "deviceClassName": "x",
                                "capacity": {"requests": {"memory": "30Gi"}},
                            },
                        },
                        {
                            "name": "either",
                            "firstAvailable": [
                                {"name": "a", "capacity": {"requests": {"memory": "10Gi"}}},
                                {"name": "b"},
                            ],
                        },
                    ]
                }
            },
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            result("plain", "20Gi"),
                            result("big", "40Gi"),
                            result("either/a", "20Gi"),
                        ]
                    }
                }
            },
        }
    )
    assert claim.devices is not None
    plain, big, either = claim.devices
    assert (plain.consumed, plain.asked) == ({"memory": "20Gi"}, {})
    assert (big.consumed, big.asked) == ({"memory": "40Gi"}, {"memory": "30Gi"})
    assert (either.share_id, either.asked) == ("share-either/a", {"memory": "10Gi"})


def entry(**device: Any) -> dict[str, Any]:
    """A checkpoint entry: one share of a device, with `device`'s extra fields."""
    return {
        "namespace": "ns",
        "name": "c",
        "uid": "u",
        "devices": [
            {"requests": ["gpu"], "pool": "n", "device": "g", "cdiIds": ["x"], **device},
        ],
        "specFile": "f.json",
        "published": [],
    }


def test_an_entry_of_an_earlier_version_loads_without_consumed_memory() -> None:
    (earlier,) = PreparedClaim.from_json(entry(shareId="s")).devices
    assert (earlier.share_id, earlier.consumed_mib, earlier.asked_mib) == ("s", None, None)
    now = entry(shareId="s", consumedMiB=40960, askedMiB=30720)
    claim = PreparedClaim.from_json(now)
    assert (claim.devices[0].consumed_mib, claim.devices[0].asked_mib) == (40960, 30720)
    assert claim.to_json() == now
    assert PreparedClaim.from_json(entry(shareId="s")).to_json() == entry(shareId="s")
    with pytest.raises(ValueError, match="not a MiB count"):
        PreparedClaim.from_json(entry(consumedMiB="40Gi"))
