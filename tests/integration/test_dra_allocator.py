"""The test allocator that stands in for the scheduler's: classes, selectors, counts, taken."""

from __future__ import annotations

from typing import Any

import pytest
from dra_support import published_devices
from support.dra.allocator import AllocationFailed, allocate, matches

from sharing_plugin.views.dra_api import V1BETA1, device_class, resource_slices

DRIVER = "gpu.sharing-plugin.io"


def claim(count: int | str, *selectors: str) -> dict[str, Any]:
    wanted: dict[str, Any] = {"deviceClassName": "gpu.gpu.sharing-plugin.io"}
    if count == "All":
        wanted["allocationMode"] = "All"
    else:
        wanted["count"] = count
    if selectors:
        wanted["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    return {"spec": {"devices": {"requests": [{"name": "r", "exactly": wanted}]}}}


def slices(generation: int = 1, api_version: str = "resource.k8s.io/v1") -> list[dict[str, Any]]:
    return resource_slices(
        published_devices(gpus=2, replicas=2),
        node_name="n",
        driver=DRIVER,
        generation=generation,
        api_version=api_version,
    )


CLASSES = [device_class("nvidia.com/gpu", DRIVER)]


def devices(allocation: dict[str, Any]) -> list[str]:
    return [r["device"] for r in allocation["devices"]["results"]]


def test_counts_selectors_and_taken_devices() -> None:
    all_four = devices(allocate(claim("All"), slices=slices(), classes=CLASSES))
    assert len(all_four) == 4
    r1 = 'device.attributes["gpu.sharing-plugin.io"].replica == 1'
    picked = devices(allocate(claim(2, r1), slices=slices(), classes=CLASSES))
    assert [d[-3:] for d in picked] == ["-r1", "-r1"]
    taken = {(DRIVER, "n", picked[0])}
    again = devices(allocate(claim(1, r1), slices=slices(), classes=CLASSES, allocated=taken))
    assert again == [picked[1]]
    with pytest.raises(AllocationFailed, match="2 free device"):
        allocate(claim(3, r1), slices=slices(), classes=CLASSES)


def test_older_generations_and_v1beta1_slices() -> None:
    both = [*slices(1), *slices(2, V1BETA1)]
    assert len(devices(allocate(claim("All"), slices=both, classes=CLASSES))) == 4


def test_unknown_class_and_cel_are_refused() -> None:
    with pytest.raises(AllocationFailed, match="no DeviceClass"):
        allocate(claim(1), slices=slices(), classes=[])
    with pytest.raises(AllocationFailed, match="does not understand"):
        allocate(claim(1, "device.capacity['x'].memory > 1"), slices=slices(), classes=CLASSES)


def test_matches_compares_literals_and_misses_absent_attributes() -> None:
    view = {"driver": DRIVER, "attributes": {(DRIVER, "index"): 3, (DRIVER, "ok"): True}}
    assert matches(f'device.driver == "{DRIVER}"', view)
    assert matches(
        f'device.attributes["{DRIVER}"].index != 2 && device.attributes["{DRIVER}"].ok == true',
        view,
    )
    assert not matches(f'device.attributes["{DRIVER}"].migProfile == "1g.10gb"', view)
