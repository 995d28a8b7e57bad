"""resource.k8s.io objects between the versions served, their validation, and discovery.

Stored in the v1 shape and converted on the way in and out for v1beta1, as kube-apiserver
converts between the versions it serves: a v1beta1 device wraps its attributes and capacity in
`basic`, a v1beta1 request names its class and selectors directly instead of under `exactly`.
ResourceSlices are validated with the API's own limits (422), since a plugin must keep them.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable
from typing import Any

from .status import bad_request, invalid
from .store import META_FIELDS, Kind
from .validation import DNS_LABEL, DNS_SUBDOMAIN, check_string_map

RESOURCE_GROUP = "resource.k8s.io"
DRA_RESOURCES = ("resourceslices", "resourceclaims", "deviceclasses")
_STORED = f"{RESOURCE_GROUP}/v1"
DRA_KINDS = {
    "resourceslices": Kind(
        "resourceslices",
        "ResourceSlice",
        False,
        ("metadata.name", "spec.nodeName", "spec.driver"),
        _STORED,
    ),
    "resourceclaims": Kind("resourceclaims", "ResourceClaim", True, META_FIELDS, _STORED),
    "deviceclasses": Kind("deviceclasses", "DeviceClass", False, ("metadata.name",), _STORED),
}
_C_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"


def dra_api_version(version: str) -> str:
    return f"{RESOURCE_GROUP}/{version}"


def to_v1(kind: Kind, obj: dict[str, Any], version: str) -> dict[str, Any]:
    """An object as a client of `version` sent it, in the stored (v1) shape."""
    obj = copy.deepcopy(obj)
    obj["apiVersion"] = dra_api_version("v1")
    spec = obj.get("spec")
    if version == "v1beta1" and isinstance(spec, dict):
        if kind.resource == "resourceslices":
            spec["devices"] = [
                {"name": d.get("name"), **(d.get("basic") or {})} if isinstance(d, dict) else d
                for d in spec.get("devices") or []
            ]
        if kind.resource == "resourceclaims":
            devices = spec.get("devices") or {}
            requests = []
            for request in devices.get("requests") or []:
                if isinstance(request, dict) and "deviceClassName" in request:
                    exactly = {k: v for k, v in request.items() if k != "name"}
                    request = {"name": request.get("name"), "exactly": exactly}
                requests.append(request)
            if devices:
                devices["requests"] = requests
    return obj


def from_v1(kind: Kind, obj: dict[str, Any], version: str) -> dict[str, Any]:
    """A stored object as a client of `version` reads it."""
    obj = copy.deepcopy(obj)
    obj["apiVersion"] = dra_api_version(version)
    spec = obj.get("spec")
    if version == "v1beta1" and isinstance(spec, dict):
        if kind.resource == "resourceslices":
            spec["devices"] = [
                {"name": d["name"], "basic": {k: v for k, v in d.items() if k != "name"}}
                for d in spec.get("devices") or []
            ]
        if kind.resource == "resourceclaims":
            for request in (spec.get("devices") or {}).get("requests") or []:
                exactly = request.pop("exactly", None)
                if exactly is not None:
                    request.update(exactly)
    return obj


def _slice_errors(obj: dict[str, Any], version: str) -> list[tuple[str, str]]:
    """The rules of ResourceSlice validation a plugin can break (a subset, same limits)."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [("spec", "Required value")]
    errors: list[tuple[str, str]] = []
    driver = spec.get("driver") or ""
    if not driver or len(driver) > 63 or not re.fullmatch(DNS_SUBDOMAIN, driver):
        errors.append(("spec.driver", f'Invalid value: "{driver}": must be a DNS subdomain'))
    pool = spec.get("pool") or {}
    if not pool.get("name"):
        errors.append(("spec.pool.name", "Required value"))
    if not isinstance(pool.get("generation"), int) or pool["generation"] < 0:
        errors.append(("spec.pool.generation", "Invalid value: must be >= 0"))
    if not isinstance(pool.get("resourceSliceCount"), int) or pool["resourceSliceCount"] < 1:
        errors.append(("spec.pool.resourceSliceCount", "Invalid value: must be > 0"))
    placements = [k for k in ("nodeName", "nodeSelector", "allNodes") if spec.get(k)]
    if len(placements) != 1:
        errors.append(("spec", "Invalid value: exactly one of nodeName, nodeSelector, allNodes"))
    devices = spec.get("devices") or []
    if len(devices) > 128:
        errors.append(("spec.devices", f"Too many: {len(devices)}: must have at most 128 items"))
    names: set[str] = set()
    for i, device in enumerate(devices):
        where = f"spec.devices[{i}]"
        name = device.get("name") or ""
        if len(name) > 63 or not re.fullmatch(DNS_LABEL, name):
            errors.append((f"{where}.name", f'Invalid value: "{name}": must be a DNS label'))
        if name in names:
            errors.append((f"{where}.name", f'Duplicate value: "{name}"'))
        names.add(name)
        body = device.get("basic") if version == "v1beta1" else device
        if version == "v1beta1" and not isinstance(body, dict):
            errors.append((f"{where}.basic", "Required value"))
            continue
        if version == "v1" and "basic" in device:
            errors.append((f"{where}.basic", "Forbidden: not a field of resource.k8s.io/v1"))
        attributes = body.get("attributes") or {}
        capacity = body.get("capacity") or {}
        if len(attributes) + len(capacity) > 32:
            errors.append((where, "Too many: attributes and capacities: at most 32"))
        for key, value in attributes.items():
            base = key.rpartition("/")[2]
            if len(base) > 32 or not re.fullmatch(_C_IDENTIFIER, base):
                errors.append(
                    (f"{where}.attributes", f'Invalid value: "{key}": not a C identifier')
                )
            kinds = [k for k in ("string", "int", "bool", "version") if k in (value or {})]
            if len(kinds) != 1:
                errors.append((f"{where}.attributes[{key}]", "Invalid value: exactly one value"))
            elif kinds == ["string"] and len(str(value["string"])) > 64:
                errors.append((f"{where}.attributes[{key}].string", "Too long: at most 64"))
        for key, value in capacity.items():
            if not isinstance(value, dict) or "value" not in value:
                errors.append((f"{where}.capacity[{key}]", "Required value: value"))
    return errors


def validate(kind: Kind, obj: dict[str, Any], version: str) -> None:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        raise bad_request("metadata: expected an object")
    check_string_map(meta.get("labels"), "metadata.labels")
    name = str(meta.get("name", ""))
    errors: list[tuple[str, str]] = []
    if kind.resource == "resourceslices":
        errors = _slice_errors(obj, version)
    elif kind.resource == "deviceclasses":
        for i, selector in enumerate((obj.get("spec") or {}).get("selectors") or []):
            if not ((selector or {}).get("cel") or {}).get("expression"):
                errors.append((f"spec.selectors[{i}].cel.expression", "Required value"))
    if errors:
        raise invalid(kind.kind, name, errors)


def discovery(path: list[str], versions: Iterable[str]) -> dict[str, Any] | None:
    """The discovery documents of the group: /apis, /apis/<group>, /apis/<group>/<version>."""
    served = [{"groupVersion": dra_api_version(v), "version": v} for v in versions]
    group = {
        "name": RESOURCE_GROUP,
        "versions": served,
        "preferredVersion": served[0] if served else {},
    }
    if path == ["apis"]:
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [group] if served else []}
    if path == ["apis", RESOURCE_GROUP] and served:
        return {"kind": "APIGroup", "apiVersion": "v1", **group}
    if len(path) == 3 and path[:2] == ["apis", RESOURCE_GROUP] and path[2] in versions:
        verbs = ["create", "delete", "deletecollection", "get", "list", "patch", "update"]
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": dra_api_version(path[2]),
            "resources": [
                {"name": k.resource, "namespaced": k.namespaced, "kind": k.kind, "verbs": verbs}
                for k in DRA_KINDS.values()
            ],
        }
    return None
