"""The test allocator that stands in for the scheduler's: classes, selectors, counts, taken."""

from __future__ import annotations

from typing import Any

import pytest
from dra_support import inventory, published_devices
from support.dra.allocator import AllocationFailed, allocate, consumed_capacity, matches

from sharing_plugin.config.base import SharedDevices
from sharing_plugin.config.model import Config
from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.plan import plan
from sharing_plugin.views.dra import dra_devices, pool_devices
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


def by_capacity(replicas: int) -> list[dict[str, Any]]:
    """One A100 80GB published by capacity, shared `replicas` ways."""
    node = inventory()
    node = Inventory(gpus=node.gpus[:1])
    cfg = Config.model_validate(
        {
            "version": "v1",
            "sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": replicas}]}},
        }
    )
    published = pool_devices(dra_devices(plan(cfg, node), node, shared=SharedDevices.CAPACITY))
    return resource_slices(published, node_name="n", driver=DRIVER, generation=1)


def asking(memory: str | None) -> dict[str, Any]:
    found = claim(1)
    if memory is not None:
        found["spec"]["devices"]["requests"][0]["exactly"]["capacity"] = {
            "requests": {"memory": memory}
        }
    return found


def test_consumable_capacity_as_the_scheduler_allocates_it() -> None:
    # As the real 1.36 allocator answered (tests/e2e/test_run_dra_realdra136.py): nothing
    # asked is the default share, a request rounded up to whole shares, each result its share.
    shared = by_capacity(4)  # 20480 MiB a share
    claims: list[dict[str, Any]] = []
    for memory in (None, "30Gi", "1Gi"):
        allocation = allocate(
            asking(memory), slices=shared, classes=CLASSES, consumed=consumed_capacity(claims)
        )
        claims.append({"status": {"allocation": allocation}})
    results = [r for c in claims for r in c["status"]["allocation"]["devices"]["results"]]
    assert [r["consumedCapacity"] for r in results] == [
        {"memory": "20Gi"},
        {"memory": "40Gi"},
        {"memory": "20Gi"},
    ]
    assert len({r["shareID"] for r in results}) == 3
    assert len({r["device"] for r in results}) == 1
    # 80 GiB of 80 consumed: the next share does not fit, nor does more than the policy's max.
    with pytest.raises(AllocationFailed, match="0 free device"):
        allocate(asking(None), slices=shared, classes=CLASSES, consumed=consumed_capacity(claims))
    with pytest.raises(AllocationFailed, match="0 free device"):
        allocate(asking("100Gi"), slices=shared, classes=CLASSES)
