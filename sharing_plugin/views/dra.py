"""The plan as Dynamic Resource Allocation sees it: devices, ResourceSlices and DeviceClasses.

Every advertised virtual device of every resource becomes one DRA device in the node's pool,
exactly as the plan partitions the GPUs: a GPU in a shared resource appears only as its
replicas, never also whole. What a device is travels as attributes the scheduler's CEL
selectors read (docs/contract.md, "DRA mode"):

    resource     string  the config's resource name, e.g. nvidia.com/gpu.shared
    uuid         string  the physical GPU or MIG device behind it
    productName  string  the GPU's product as NVML names it
    sharing      string  none | time-slicing | mps
    index        int     the GPU's index
    migProfile   string  MIG devices only, e.g. 1g.10gb
    replica      int     shared devices only, the replica number
    memory       capacity, the physical device's memory

Device names are DNS labels made of the physical UUID and the replica number
(`gpu-<uuid>`, `mig-<uuid>`, `gpu-<uuid>-r<n>`), so the same virtual device keeps its name
across reloads and restarts, as its device plugin ID does. The pool is named after the node and
split into slices of at most 128 devices (the API's limit); each republish carries a new pool
generation, and the scheduler only trusts the slices of the newest one.

`PublishedDevice` is a device in the API's own terms, independent of the API version, so that
a device held by a prepared claim can be published unchanged after the config that made it is
gone (the draining rule), even across restarts. Everything here is pure: the adapter sends the
documents and keeps what it published.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from sharing_plugin.config.model import Config
from sharing_plugin.config.rules import advertised_name
from sharing_plugin.errors import PlanError, Problem
from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.plan.model import Plan, VirtualDevice
from sharing_plugin.plan.node import NodePlan

RESOURCE_GROUP: Final = "resource.k8s.io"
V1: Final = f"{RESOURCE_GROUP}/v1"
V1BETA1: Final = f"{RESOURCE_GROUP}/v1beta1"
API_VERSIONS: Final = (V1, V1BETA1)  # newest first: the one picked when a server has both

MAX_DEVICES_PER_SLICE: Final = 128  # ResourceSliceMaxDevices
MAX_STRING_ATTRIBUTE: Final = 64  # DeviceAttributeMaxValueLength
DEFAULT_DRIVER: Final = "gpu.sharing-plugin.io"
_DNS_LABEL_MAX = 63
_DNS_SUBDOMAIN_MAX = 253
_UNSAFE = re.compile(r"[^a-z0-9-]+")
_UNSAFE_DOTTED = re.compile(r"[^a-z0-9.-]+")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")

Attribute = dict[str, str | int | bool]
"""One attribute value in the API's form: {"string": ...}, {"int": ...} or {"bool": ...}."""


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


def device_name(device: VirtualDevice) -> str:
    """The DRA device name of a virtual device: its physical UUID, plus `-r<n>` for replica n.

    Stable for the same physical device and replica, like the device plugin ID it mirrors.
    """
    suffix = "" if device.replica is None else f"-r{device.replica}"
    return dns_label(f"{device.physical}{suffix}")


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


def memory_quantity(mib: int) -> str:
    """MiB as a Kubernetes quantity in its canonical form (the largest exact binary suffix)."""
    if mib and mib % (1024 * 1024) == 0:
        return f"{mib // (1024 * 1024)}Ti"
    if mib and mib % 1024 == 0:
        return f"{mib // 1024}Gi"
    return f"{mib}Mi"


@dataclass(frozen=True, slots=True)
class PublishedDevice:
    """One device of the pool in the API's terms, whatever the API version."""

    name: str
    attributes: Mapping[str, Attribute]
    capacity: Mapping[str, str]  # name -> quantity

    def document(self, api_version: str) -> dict[str, Any]:
        """The device as `api_version` writes it (v1beta1 wraps it in `basic`)."""
        body: dict[str, Any] = {
            "attributes": {k: dict(v) for k, v in self.attributes.items()},
            "capacity": {k: {"value": q} for k, q in self.capacity.items()},
        }
        if api_version == V1BETA1:
            return {"name": self.name, "basic": body}
        return {"name": self.name, **body}

    def to_json(self) -> dict[str, Any]:
        """A version-free form for checkpoints; `from_json` reads it back."""
        return {
            "name": self.name,
            "attributes": {k: dict(v) for k, v in self.attributes.items()},
            "capacity": dict(self.capacity),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PublishedDevice:
        return cls(
            name=str(data["name"]),
            attributes={str(k): dict(v) for k, v in dict(data["attributes"]).items()},
            capacity={str(k): str(v) for k, v in dict(data["capacity"]).items()},
        )


@dataclass(frozen=True, slots=True)
class DraDevice:
    """A virtual device of the plan, with what DRA publishes about it."""

    name: str
    resource: str
    sharing: str
    device: VirtualDevice
    product: str
    gpu_index: int
    mig_profile: str | None
    memory_mib: int

    @property
    def healthy(self) -> bool:
        return self.device.healthy

    def published(self) -> PublishedDevice:
        attributes: dict[str, Attribute] = {
            "resource": {"string": self.resource},
            "uuid": {"string": self.device.physical},
            "productName": {"string": self.product[:MAX_STRING_ATTRIBUTE]},
            "sharing": {"string": self.sharing},
            "index": {"int": self.gpu_index},
        }
        if self.mig_profile is not None:
            attributes["migProfile"] = {"string": self.mig_profile}
        if self.device.replica is not None:
            attributes["replica"] = {"int": self.device.replica}
        return PublishedDevice(
            name=self.name,
            attributes=attributes,
            capacity={"memory": memory_quantity(self.memory_mib)},
        )


def dra_devices(plan: Plan, inventory: Inventory) -> tuple[DraDevice, ...]:
    """Every device of `plan` as a DRA device, resources in name order, devices in plan order.

    Raises `PlanError` for what the API cannot carry: a resource name longer than a string
    attribute may be, or two devices with one name.
    """
    devices: list[DraDevice] = []
    problems: list[Problem] = []
    for resource in plan.resources:
        if len(resource.name) > MAX_STRING_ATTRIBUTE:
            problems.append(
                Problem(
                    "",
                    f"{resource.name}: a DRA attribute holds at most {MAX_STRING_ATTRIBUTE} "
                    f"characters, this resource name has {len(resource.name)}: shorten it",
                )
            )
            continue
        for device in resource.devices:
            gpu = inventory.gpu(device.gpu_uuid)
            mig = inventory.mig_device(device.physical) if device.is_mig else None
            memory = mig.memory_mib if mig is not None else gpu.memory_mib if gpu else 0
            devices.append(
                DraDevice(
                    name=device_name(device),
                    resource=resource.name,
                    sharing=resource.sharing.value,
                    device=device,
                    product=gpu.product if gpu is not None else "",
                    gpu_index=gpu.index if gpu is not None else int(device.index.split(":")[0]),
                    mig_profile=mig.profile if mig is not None else None,
                    memory_mib=memory,
                )
            )
    seen: dict[str, DraDevice] = {}
    for d in devices:
        other = seen.setdefault(d.name, d)
        if other is not d:
            problems.append(
                Problem("", f"devices {other.device.id} and {d.device.id} share DRA name {d.name}")
            )
    if problems:
        raise PlanError(problems)
    return tuple(devices)


def pool_devices(
    devices: Sequence[DraDevice],
    *,
    held: Iterable[str] = (),
    kept: Mapping[str, PublishedDevice] | None = None,
) -> tuple[PublishedDevice, ...]:
    """What the pool publishes: every healthy device, then the held devices the plan dropped.

    `held` names devices of prepared claims; `kept` has what was published for them. A held
    device the plan no longer has stays published unchanged until its claim is unprepared
    (the draining rule); a held device the plan still has but that is unhealthy leaves the
    pool like any unhealthy device.
    """
    kept = kept or {}
    published = [d.published() for d in devices if d.healthy]
    planned = {d.name for d in devices}
    for name in sorted(set(held) - planned):
        if name in kept:
            published.append(kept[name])
    return tuple(published)


def _slice_name(node_name: str, driver: str, index: int) -> str:
    base = _UNSAFE_DOTTED.sub("-", f"{node_name}-{driver}".lower()).strip("-.")
    return _hashed(f"{base}-{index}", _DNS_SUBDOMAIN_MAX)


def resource_slices(
    devices: Sequence[PublishedDevice],
    *,
    node_name: str,
    driver: str,
    generation: int,
    api_version: str = V1,
) -> list[dict[str, Any]]:
    """The pool `node_name` publishes: slices of at most 128 devices, named
    `<node>-<driver>-<n>`, all of one generation. No devices: no slice."""
    chunks = [
        devices[i : i + MAX_DEVICES_PER_SLICE]
        for i in range(0, len(devices), MAX_DEVICES_PER_SLICE)
    ]
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
                    "resourceSliceCount": len(chunks),
                },
                "devices": [d.document(api_version) for d in chunk],
            },
        }
        for i, chunk in enumerate(chunks)
    ]


def class_selector(resource: str, driver: str) -> str:
    """The CEL expression of a DeviceClass: the driver's devices of one resource."""
    return (
        f"device.driver == {_cel_string(driver)} && "
        f"device.attributes[{_cel_string(driver)}].resource == {_cel_string(resource)}"
    )


def _cel_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def device_class(resource: str, driver: str, *, api_version: str = V1) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": "DeviceClass",
        "metadata": {"name": device_class_name(resource, driver)},
        "spec": {"selectors": [{"cel": {"expression": class_selector(resource, driver)}}]},
    }


def config_resource_names(config: Config) -> set[str]:
    """The resource names a config names itself (patterns and sharing), whatever the node."""
    names = {p.name for p in (*config.resources.gpus, *config.resources.mig)}
    sharing = config.sharing.active
    if sharing is not None:
        names.update(advertised_name(entry, sharing) for entry in sharing.resources)
    return names


def dra_documents(
    config: Config,
    node_plan: NodePlan,
    node_name: str,
    driver_name: str = DEFAULT_DRIVER,
    *,
    api_version: str = V1,
    generation: int = 1,
) -> list[dict[str, Any]]:
    """What `run-dra` publishes for this node: one DeviceClass per resource name (those of the
    plan and those the config names), then the node's ResourceSlices. Healthy devices only,
    as the pool carries them."""
    devices = dra_devices(node_plan.plan, node_plan.inventory)
    names = sorted({r.name for r in node_plan.plan.resources} | config_resource_names(config))
    classes = [device_class(n, driver_name, api_version=api_version) for n in names]
    slices = resource_slices(
        pool_devices(devices),
        node_name=node_name,
        driver=driver_name,
        generation=generation,
        api_version=api_version,
    )
    return [*classes, *slices]
