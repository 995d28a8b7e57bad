"""The node's pool in the terms of the resource.k8s.io API: devices, counter sets, slices, classes.

`PublishedDevice` is one device of the pool as the API carries it, whatever the API version: its
attributes, its capacities (a capacity may carry a request policy: what a claim that asks
nothing consumes of it, and the range a claim may ask within), whether several claims may be
allocated it at once (`allowMultipleAllocations`: consumable capacity), the counters it consumes
(partitionable devices: a MIG placement consumes its GPU's memory and compute slices) and its
taints (an unhealthy GPU's devices stay visible with a `NoSchedule` taint). Counter sets are
published in slices of their own: the API refuses `sharedCounters` and `devices` in one slice.

The limits are the API server's (Kubernetes 1.34-1.36, checked against the real kube-apiserver
1.36): at most 128 devices in a slice, 64 when any of them consumes counters or has taints; at
most 8 counter sets in a slice; names are DNS labels (devices, counters) or subdomains (slices,
classes); a taint's value is a label value. Everything here is pure: the adapter sends the
documents and keeps what it published.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from sharing_plugin.config.quantity import quantity_bytes

RESOURCE_GROUP: Final = "resource.k8s.io"
V1: Final = f"{RESOURCE_GROUP}/v1"
V1BETA1: Final = f"{RESOURCE_GROUP}/v1beta1"
API_VERSIONS: Final = (V1, V1BETA1)  # newest first: the one picked when a server has both

MAX_DEVICES_PER_SLICE: Final = 128  # ResourceSliceMaxDevices
MAX_DEVICES_WITH_TAINTS_OR_COUNTERS: Final = (
    64  # ResourceSliceMaxDevicesWithTaintsOrConsumesCounters
)
MAX_COUNTER_SETS_PER_SLICE: Final = 8  # ResourceSliceMaxSharedCounters
MAX_STRING_ATTRIBUTE: Final = 64  # DeviceAttributeMaxValueLength
DEFAULT_DRIVER: Final = "gpu.sharing-plugin.io"
_DNS_LABEL_MAX = 63
_DNS_SUBDOMAIN_MAX = 253
_UNSAFE = re.compile(r"[^a-z0-9-]+")
_UNSAFE_DOTTED = re.compile(r"[^a-z0-9.-]+")
_UNSAFE_LABEL_VALUE = re.compile(r"[^A-Za-z0-9_.-]+")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")

Attribute = dict[str, str | int | bool]
"""One attribute value in the API's form: {"string": ...}, {"int": ...}, {"bool": ...} or
{"version": ...} (semantic versioning 2.0)."""


def _hashed(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, ending in 8 hex characters of its hash when cut."""
    if len(text) <= limit:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{text[: limit - 9].rstrip('-.')}-{digest}"


def is_dns_subdomain(text: str) -> bool:
    """Whether `text` is an RFC 1123 subdomain, as a Node, a pool and most objects are named."""
    return len(text) <= _DNS_SUBDOMAIN_MAX and _SUBDOMAIN.fullmatch(text) is not None


def dns_label(text: str) -> str:
    """`text` as an RFC 1123 label: lower case, `[a-z0-9-]`, at most 63 characters."""
    slug = _UNSAFE.sub("-", text.lower()).strip("-") or "x"
    return _hashed(slug, _DNS_LABEL_MAX)


def taint_value(text: str) -> str:
    """`text` as a label value (a taint's value): `[A-Za-z0-9_.-]`, alphanumeric at both ends,
    at most 63 characters."""
    slug = _UNSAFE_LABEL_VALUE.sub("-", text).strip("-_.")
    return _hashed(slug, _DNS_LABEL_MAX).strip("-_.")


def memory_quantity(mib: int) -> str:
    """MiB as a Kubernetes quantity in its canonical form (the largest exact binary suffix)."""
    if mib and mib % (1024 * 1024) == 0:
        return f"{mib // (1024 * 1024)}Ti"
    if mib and mib % 1024 == 0:
        return f"{mib // 1024}Gi"
    return f"{mib}Mi"


def quantity_mib(text: str) -> int | None:
    """A memory quantity the API server wrote (`20Gi`, `21474836480`: bytes without a unit) in
    whole MiB, rounded down; None when it is not one."""
    found = quantity_bytes(text)
    return None if found is None else found >> 20


@dataclass(frozen=True, slots=True)
class Capacity:
    """A device capacity: its value and, for consumable capacity, its request policy.

    `default` is what a claim that asks nothing consumes; `minimum`, `maximum` and `step` are
    the range a claim may ask within (the scheduler rounds a request up to a step). Quantities
    are Kubernetes quantities (`80Gi`).
    """

    value: str
    default: str | None = None
    minimum: str | None = None
    maximum: str | None = None
    step: str | None = None

    @property
    def consumable(self) -> bool:
        return self.default is not None

    def document(self) -> dict[str, Any]:
        body: dict[str, Any] = {"value": self.value}
        if self.default is not None:
            policy: dict[str, Any] = {"default": self.default}
            valid = {
                k: v
                for k, v in (("min", self.minimum), ("max", self.maximum), ("step", self.step))
                if v is not None
            }
            if valid:
                policy["validRange"] = valid
            body["requestPolicy"] = policy
        return body

    def to_json(self) -> dict[str, str]:
        return {
            k: v
            for k, v in (
                ("value", self.value),
                ("default", self.default),
                ("min", self.minimum),
                ("max", self.maximum),
                ("step", self.step),
            )
            if v is not None
        }

    @classmethod
    def from_json(cls, data: str | Mapping[str, Any]) -> Capacity:
        if isinstance(data, str):  # checkpoints written before request policies: the value
            return cls(data)
        return cls(
            value=str(data["value"]),
            default=_optional(data, "default"),
            minimum=_optional(data, "min"),
            maximum=_optional(data, "max"),
            step=_optional(data, "step"),
        )


def _optional(data: Mapping[str, Any], key: str) -> str | None:
    value = data.get(key)
    return None if value is None else str(value)


@dataclass(frozen=True, slots=True)
class DeviceTaint:
    """A device taint: `key` under the driver's domain, `value` a label value, `effect`
    `NoSchedule` (not allocated to new claims that do not tolerate it)."""

    key: str
    value: str
    effect: str = "NoSchedule"

    def document(self) -> dict[str, str]:
        return {"key": self.key, "value": self.value, "effect": self.effect}


@dataclass(frozen=True, slots=True)
class CounterSet:
    """A set of shared counters (partitionable devices): for a MIG-capable GPU, one counter per
    memory slice and one for its compute slices. Devices consume from it; the allocator never
    lets the consumed total pass a counter's value."""

    name: str
    counters: Mapping[str, int]

    def document(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "counters": {k: {"value": str(v)} for k, v in self.counters.items()},
        }


@dataclass(frozen=True, slots=True)
class PublishedDevice:
    """One device of the pool in the API's terms, whatever the API version."""

    name: str
    attributes: Mapping[str, Attribute]
    capacity: Mapping[str, Capacity]
    multiple_allocations: bool = False
    consumes: Mapping[str, Mapping[str, int]] = field(default_factory=dict)  # set -> counters
    taints: tuple[DeviceTaint, ...] = ()

    @property
    def limited(self) -> bool:
        """Whether the slice holding it is limited to 64 devices (counters or taints)."""
        return bool(self.consumes or self.taints)

    def document(self, api_version: str) -> dict[str, Any]:
        """The device as `api_version` writes it (v1beta1 wraps it in `basic`)."""
        body: dict[str, Any] = {
            "attributes": {k: dict(v) for k, v in self.attributes.items()},
            "capacity": {k: c.document() for k, c in self.capacity.items()},
        }
        if self.multiple_allocations:
            body["allowMultipleAllocations"] = True
        if self.consumes:
            body["consumesCounters"] = [
                {"counterSet": name, "counters": {k: {"value": str(v)} for k, v in used.items()}}
                for name, used in self.consumes.items()
            ]
        if self.taints:
            body["taints"] = [t.document() for t in self.taints]
        if api_version == V1BETA1:
            return {"name": self.name, "basic": body}
        return {"name": self.name, **body}

    def to_json(self) -> dict[str, Any]:
        """A version-free form for checkpoints; `from_json` reads it back."""
        data: dict[str, Any] = {
            "name": self.name,
            "attributes": {k: dict(v) for k, v in self.attributes.items()},
            "capacity": {k: c.to_json() for k, c in self.capacity.items()},
        }
        if self.multiple_allocations:
            data["allowMultipleAllocations"] = True
        if self.consumes:
            data["consumes"] = {k: dict(v) for k, v in self.consumes.items()}
        if self.taints:
            data["taints"] = [t.document() for t in self.taints]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PublishedDevice:
        return cls(
            name=str(data["name"]),
            attributes={str(k): dict(v) for k, v in dict(data["attributes"]).items()},
            capacity={str(k): Capacity.from_json(v) for k, v in dict(data["capacity"]).items()},
            multiple_allocations=bool(data.get("allowMultipleAllocations", False)),
            consumes={
                str(k): {str(c): int(n) for c, n in dict(v).items()}
                for k, v in dict(data.get("consumes") or {}).items()
            },
            taints=tuple(
                DeviceTaint(str(t["key"]), str(t.get("value", "")), str(t["effect"]))
                for t in data.get("taints") or ()
            ),
        )


def _slice_name(node_name: str, driver: str, index: int) -> str:
    base = _UNSAFE_DOTTED.sub("-", f"{node_name}-{driver}".lower()).strip("-.")
    return _hashed(f"{base}-{index}", _DNS_SUBDOMAIN_MAX)


def _chunks(devices: Sequence[PublishedDevice]) -> list[Sequence[PublishedDevice]]:
    """Consecutive slices of devices, each within the API's limit for what it holds."""
    chunks: list[Sequence[PublishedDevice]] = []
    start = 0
    while start < len(devices):
        end = start
        limit = MAX_DEVICES_PER_SLICE
        while end < len(devices):
            if devices[end].limited:
                limit = MAX_DEVICES_WITH_TAINTS_OR_COUNTERS
            if end - start >= limit:
                break
            end += 1
        chunks.append(devices[start:end])
        start = end
    return chunks


def resource_slices(
    devices: Sequence[PublishedDevice],
    *,
    counter_sets: Sequence[CounterSet] = (),
    node_name: str,
    driver: str,
    generation: int,
    api_version: str = V1,
) -> list[dict[str, Any]]:
    """The pool `node_name` publishes: first the counter sets (at most 8 a slice), then the
    devices (at most 128 a slice, 64 where a device consumes counters or has taints), named
    `<node>-<driver>-<n>`, all of one generation. Nothing to publish: no slice."""
    counter_chunks = [
        counter_sets[i : i + MAX_COUNTER_SETS_PER_SLICE]
        for i in range(0, len(counter_sets), MAX_COUNTER_SETS_PER_SLICE)
    ]
    device_chunks = _chunks(devices)
    bodies: list[dict[str, Any]] = [
        {"sharedCounters": [c.document() for c in chunk]} for chunk in counter_chunks
    ]
    bodies += [{"devices": [d.document(api_version) for d in chunk]} for chunk in device_chunks]
    return [
        {
            "apiVersion": api_version,
            "kind": "ResourceSlice",
            "metadata": {"name": _slice_name(node_name, driver, i)},
            "spec": {
                "driver": driver,
                "nodeName": node_name,
                "pool": {
                    "name": node_name,
                    "generation": generation,
                    "resourceSliceCount": len(bodies),
                },
                **body,
            },
        }
        for i, body in enumerate(bodies)
    ]


def device_class_name(resource: str, driver: str) -> str:
    """The DeviceClass selecting `resource`'s devices: `<name>.<driver>` for nvidia.com names
    (`gpu.shared.gpu.sharing-plugin.io`), `<name>.<domain>.<driver>` for other domains."""
    domain, _, name = resource.rpartition("/")
    parts = [name] if domain in ("", "nvidia.com") else [name, domain]
    labels = []
    for part in parts:
        for label in _UNSAFE_DOTTED.sub("-", part.lower()).split("."):
            cleaned = label.strip("-")
            if cleaned:
                labels.append(cleaned[:_DNS_LABEL_MAX].strip("-"))
    return _hashed(".".join([*labels, driver]), _DNS_SUBDOMAIN_MAX)


def class_selector(resource: str, driver: str) -> str:
    """The CEL expression of a DeviceClass: the driver's devices of one resource."""
    return (
        f"device.driver == {_cel_string(driver)} && "
        f"device.attributes[{_cel_string(driver)}].resource == {_cel_string(resource)}"
    )


def _cel_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def device_class(resource: str, driver: str, *, api_version: str = V1) -> dict[str, Any]:
    """The DeviceClass of `resource`'s devices. In v1 it also claims `resource` as its extended
    resource name (`spec.extendedResourceName`, Kubernetes 1.34+): a pod asking
    `resources.limits: {nvidia.com/gpu: 1}`, as written for the device plugin, is given one of
    these devices through a claim the scheduler makes, on nodes that do not list the name in
    their allocatable (those served by a device plugin keep it). The name must be unique among
    the cluster's classes (the API server does not check; the scheduler takes the newest class),
    which holds with one class per resource name and driver."""
    spec: dict[str, Any] = {
        "selectors": [{"cel": {"expression": class_selector(resource, driver)}}]
    }
    if api_version == V1:
        spec["extendedResourceName"] = resource
    return {
        "apiVersion": api_version,
        "kind": "DeviceClass",
        "metadata": {"name": device_class_name(resource, driver)},
        "spec": spec,
    }


CONSUMABLE_CAPACITY: Final = "DRAConsumableCapacity"
PARTITIONABLE_DEVICES: Final = "DRAPartitionableDevices"
DEVICE_TAINTS: Final = "DRADeviceTaints"


def dropped_features(sent: Mapping[str, Any], stored: Mapping[str, Any]) -> frozenset[str]:
    """The features (their feature gates' names) whose fields a slice we wrote carried and the
    API server did not keep: a server with a feature's gate off drops its fields on write,
    silently, and stores the rest."""
    dropped: set[str] = set()
    if sent["spec"].get("sharedCounters") and not stored.get("spec", {}).get("sharedCounters"):
        dropped.add(PARTITIONABLE_DEVICES)
    kept = {d.get("name"): d for d in stored.get("spec", {}).get("devices") or ()}
    for device in sent["spec"].get("devices") or ():
        ours = device.get("basic", device)
        theirs = kept.get(device["name"]) or {}
        theirs = theirs.get("basic", theirs)
        if ours.get("allowMultipleAllocations") and not theirs.get("allowMultipleAllocations"):
            dropped.add(CONSUMABLE_CAPACITY)
        for name, capacity in (ours.get("capacity") or {}).items():
            if "requestPolicy" in capacity and "requestPolicy" not in (
                (theirs.get("capacity") or {}).get(name) or {}
            ):
                dropped.add(CONSUMABLE_CAPACITY)
        if ours.get("consumesCounters") and not theirs.get("consumesCounters"):
            dropped.add(PARTITIONABLE_DEVICES)
        if ours.get("taints") and not theirs.get("taints"):
            dropped.add(DEVICE_TAINTS)
    return frozenset(dropped)
