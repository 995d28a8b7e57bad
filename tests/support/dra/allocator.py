"""A small stand-in for the scheduler's DRA allocator, for the tests.

In a cluster the scheduler's allocator (k8s.io/dynamic-resource-allocation/structured, with the
full CEL environment) decides which devices a claim gets; this module only picks devices the
way a simple claim would get them, so the plugin's prepare path can be exercised end to end
without a scheduler:

- devices come from the ResourceSlices given (v1 or v1beta1), newest pool generation only;
- a request's DeviceClass selectors and its own selectors must all hold; the CEL understood is
  the subset DeviceClasses and simple claims use: `&&` of comparisons (`==`, `!=`) between
  `device.driver`, `device.attributes["<domain>"].<name>` and string, int or bool literals;
  anything else raises `AllocationFailed` naming the expression;
- `allocationMode` ExactCount (`count`, default 1) or All; devices already allocated to other
  claims are skipped; the first matching devices in slice order are taken;
- consumable capacity as the scheduler's allocator does it (DRAConsumableCapacity): a device
  with `allowMultipleAllocations` stays allocatable while its capacities last. Each result on
  one gets a `shareID` and `consumedCapacity` with every capacity of the device: what the
  request asks (`capacity.requests`) rounded up by the capacity's request policy (below `min`:
  `min`; else `min` plus whole `step`s), its policy's `default` where it asks nothing (the full
  value without a policy); more than the policy's `max`, or than what is left, does not fit. A
  request's capacity on a device allocated whole is a selector: the device must have that much.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sharing_plugin.config.quantity import quantity_bytes


class AllocationFailed(Exception):
    """The claim cannot be satisfied, or uses what this allocator does not understand."""


DeviceKey = tuple[str, str, str]  # (driver, pool, device)

_COMPARISON = re.compile(
    r"""\s*(?P<left>device\.driver|device\.attributes\["(?P<domain>[^"]+)"\]\.(?P<name>\w+))
        \s*(?P<op>==|!=)\s*
        (?P<right>"(?:[^"\\]|\\.)*"|-?\d+|true|false)\s*""",
    re.VERBOSE,
)


def _literal(text: str) -> object:
    if text in ("true", "false"):
        return text == "true"
    return json.loads(text)


def _device_view(driver: str, device: Mapping[str, Any]) -> dict[str, Any]:
    """driver, name and attributes by (domain, name) of a device of either version."""
    body = device.get("basic") or device
    attributes: dict[tuple[str, str], object] = {}
    for key, value in (body.get("attributes") or {}).items():
        domain, _, name = key.rpartition("/")
        attributes[(domain or driver, name)] = next(iter(value.values()))
    return {
        "driver": driver,
        "name": device["name"],
        "attributes": attributes,
        "capacity": body.get("capacity") or {},
        "multiple": bool(body.get("allowMultipleAllocations")),
    }


def matches(expression: str, view: Mapping[str, Any]) -> bool:
    """Whether the device `view` satisfies a CEL expression of the understood subset."""
    for term in expression.split("&&"):
        m = _COMPARISON.fullmatch(term)
        if m is None:
            raise AllocationFailed(f"the test allocator does not understand CEL {expression!r}")
        if m["domain"] is None:
            left: object = view["driver"]
        else:
            key = (m["domain"], m["name"])
            if key not in view["attributes"]:
                return False  # a missing attribute is a runtime error in CEL: no match
            left = view["attributes"][key]
        right = _literal(m["right"])
        if (left == right) != (m["op"] == "=="):
            return False
    return True


def _selectors(selectors: Iterable[Mapping[str, Any]] | None) -> list[str]:
    return [s["cel"]["expression"] for s in selectors or () if "cel" in s]


def candidates(slices: Sequence[Mapping[str, Any]]) -> list[tuple[DeviceKey, dict[str, Any]]]:
    """Every device of the newest generation of each pool, in slice order."""
    newest: dict[tuple[str, str], int] = {}
    for s in slices:
        spec = s["spec"]
        key = (spec["driver"], spec["pool"]["name"])
        newest[key] = max(newest.get(key, 0), int(spec["pool"]["generation"]))
    found: list[tuple[DeviceKey, dict[str, Any]]] = []
    for s in slices:
        spec = s["spec"]
        pool = spec["pool"]
        if int(pool["generation"]) != newest[(spec["driver"], pool["name"])]:
            continue
        for device in spec.get("devices") or ():
            device_key = (str(spec["driver"]), str(pool["name"]), str(device["name"]))
            found.append((device_key, _device_view(spec["driver"], device)))
    return found


def allocated_devices(claims: Iterable[Mapping[str, Any]]) -> set[DeviceKey]:
    """The devices the given claims' allocations hold."""
    held: set[DeviceKey] = set()
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for r in (allocation.get("devices") or {}).get("results") or ():
            held.add((r["driver"], r["pool"], r["device"]))
    return held


def consumed_capacity(claims: Iterable[Mapping[str, Any]]) -> dict[DeviceKey, dict[str, int]]:
    """What the given claims' allocations consume of each device (capacity -> bytes)."""
    used: dict[DeviceKey, dict[str, int]] = {}
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for r in (allocation.get("devices") or {}).get("results") or ():
            of_device = used.setdefault((r["driver"], r["pool"], r["device"]), {})
            for name, quantity in (r.get("consumedCapacity") or {}).items():
                of_device[name] = of_device.get(name, 0) + _bytes(quantity)
    return used


def _bytes(quantity: object) -> int:
    found = quantity_bytes(str(quantity))
    if found is None:
        raise AllocationFailed(f"the test allocator does not understand quantity {quantity!r}")
    return found


def _quantity(value: int) -> str:
    """Bytes as the API server writes a binary quantity (`40Gi`, `3840Mi`)."""
    for suffix, unit in (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if value and value % unit == 0:
            return f"{value // unit}{suffix}"
    return str(value)


def _consumes(view: Mapping[str, Any], asked: Mapping[str, Any]) -> dict[str, str] | None:
    """What a request asking `asked` consumes of a device allowing several allocations, every
    capacity of it; None where the request violates a capacity's policy."""
    consumed: dict[str, str] = {}
    for name, capacity in view["capacity"].items():
        policy = capacity.get("requestPolicy") or {}
        if name not in asked:
            consumed[name] = str(policy.get("default") or capacity["value"])
            continue
        wanted = _bytes(asked[name])
        valid = policy.get("validRange") or {}
        if "min" in valid:
            low = _bytes(valid["min"])
            if wanted < low:
                wanted = low
            elif "step" in valid:
                step = _bytes(valid["step"])
                wanted = low + -(-(wanted - low) // step) * step
            if "max" in valid and wanted > _bytes(valid["max"]):
                return None
        consumed[name] = _quantity(wanted)
    return consumed


def _fits(view: Mapping[str, Any], consumed: Mapping[str, str], used: Mapping[str, int]) -> bool:
    return all(
        used.get(name, 0) + _bytes(amount) <= _bytes(view["capacity"][name]["value"])
        for name, amount in consumed.items()
    )


def _has(view: Mapping[str, Any], asked: Mapping[str, Any]) -> bool:
    """Whether a device allocated whole has every capacity a request asks."""
    capacity = view["capacity"]
    return all(
        name in capacity and _bytes(capacity[name]["value"]) >= _bytes(amount)
        for name, amount in asked.items()
    )


def allocate(
    claim: Mapping[str, Any],
    *,
    slices: Sequence[Mapping[str, Any]],
    classes: Sequence[Mapping[str, Any]],
    allocated: Iterable[DeviceKey] = (),
    consumed: Mapping[DeviceKey, Mapping[str, int]] | None = None,
) -> dict[str, Any]:
    """The `status.allocation` the claim gets; raises AllocationFailed when it cannot.

    `allocated` are the devices other claims hold (`allocated_devices`), `consumed` what they
    consume of devices allowing several allocations (`consumed_capacity`)."""
    by_name = {c["metadata"]["name"]: c for c in classes}
    taken = set(allocated)
    used = {key: dict(amounts) for key, amounts in (consumed or {}).items()}
    pool = candidates(slices)
    results = []
    for request in claim["spec"]["devices"]["requests"]:
        wanted = request.get("exactly") or request  # v1 nests it, v1beta1 does not
        class_name = wanted.get("deviceClassName")
        device_class = by_name.get(class_name)
        if device_class is None:
            raise AllocationFailed(f"request {request['name']}: no DeviceClass {class_name!r}")
        expressions = [
            *_selectors(device_class.get("spec", {}).get("selectors")),
            *_selectors(wanted.get("selectors")),
        ]
        asked = (wanted.get("capacity") or {}).get("requests") or {}
        fitting: list[tuple[DeviceKey, dict[str, str] | None]] = []
        for key, view in pool:
            if not all(matches(e, view) for e in expressions):
                continue
            if not view["multiple"]:
                if key not in taken and _has(view, asked):
                    fitting.append((key, None))
                continue
            share = _consumes(view, asked)
            if share is not None and _fits(view, share, used.get(key, {})):
                fitting.append((key, share))
        mode = wanted.get("allocationMode", "ExactCount")
        count = len(fitting) if mode == "All" else int(wanted.get("count", 1))
        if len(fitting) < count or count == 0:
            raise AllocationFailed(
                f"request {request['name']}: {len(fitting)} free device(s) of class "
                f"{class_name} match, {count if count else 'at least one'} needed"
            )
        for (driver, pool_name, device), share in fitting[:count]:
            key = (driver, pool_name, device)
            result: dict[str, Any] = {
                "request": request["name"],
                "driver": driver,
                "pool": pool_name,
                "device": device,
            }
            if share is None:
                taken.add(key)
            else:
                result |= {"shareID": str(uuid.uuid4()), "consumedCapacity": share}
                of_device = used.setdefault(key, {})
                for name, amount in share.items():
                    of_device[name] = of_device.get(name, 0) + _bytes(amount)
            results.append(result)
    return {"devices": {"results": results}}


def extended_resource_claim(
    pod: Mapping[str, Any], *, classes: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """The ResourceClaim the scheduler makes for a pod that asks extended resources a
    DeviceClass names (`spec.extendedResourceName`, KEP-5004 DRAExtendedResource): one request
    per container and resource, for that many devices of the class. Resources no class names
    are left to the device plugins (none here: a pod with none is an error)."""
    by_resource: dict[str, Mapping[str, Any]] = {}
    for device_class in classes:  # the newest class claiming a name wins, as in the scheduler
        name = device_class.get("spec", {}).get("extendedResourceName")
        if name:
            by_resource[name] = device_class
    requests: list[dict[str, Any]] = []
    for index, container in enumerate(pod["spec"]["containers"]):
        limits = (container.get("resources") or {}).get("limits") or {}
        for resource, count in sorted(limits.items()):
            named = by_resource.get(resource)
            if named is None:
                continue
            requests.append(
                {
                    "name": f"container-{index}-request-{len(requests)}",
                    "exactly": {
                        "deviceClassName": named["metadata"]["name"],
                        "allocationMode": "ExactCount",
                        "count": int(count),
                    },
                }
            )
    if not requests:
        raise AllocationFailed(f"pod {pod['metadata']['name']} asks no extended resource of DRA")
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": f"{pod['metadata']['name']}-extended-resources",
            "namespace": pod["metadata"].get("namespace", "default"),
        },
        "spec": {"devices": {"requests": requests}},
    }
