"""Device selections (`devices:`) as typed values: parsed once at load, dumped back losslessly.

The reference plugin accepts `all`, a positive count, or a list whose items are GPU indices
(integers or digit strings), MIG indices `"gpu:mig"`, GPU/MIG UUIDs and the old MIG form
`MIG-GPU-<uuid>/<gi>/<ci>`. We parse them here into frozen references so later code never
re-parses strings, and add `{product: <glob>}` to select GPUs by the name NVML reports.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic_core import PydanticCustomError

_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_GPU_UUID = re.compile(rf"GPU-{_UUID}")
_MIG_UUID = re.compile(rf"MIG-{_UUID}")
_MIG_GI_CI = re.compile(rf"MIG-(GPU-{_UUID})/(\d+)/(\d+)")
_MIG_INDEX = re.compile(r"(\d+):(\d+)")
_INDEX = re.compile(r"\d+")


@dataclass(frozen=True, slots=True)
class GpuIndexRef:
    """`0` or `"0"`: the GPU with that NVML index."""

    index: int


@dataclass(frozen=True, slots=True)
class MigIndexRef:
    """`"0:1"`: MIG device 1 of GPU 0."""

    gpu: int
    mig: int


@dataclass(frozen=True, slots=True)
class UuidRef:
    """`GPU-<uuid>` or `MIG-<uuid>`."""

    uuid: str


@dataclass(frozen=True, slots=True)
class MigGiCiRef:
    """`MIG-GPU-<uuid>/<gi>/<ci>`: the old-style MIG device name."""

    gpu_uuid: str
    gi: int
    ci: int


@dataclass(frozen=True, slots=True)
class ProductRef:
    """`{product: <glob>}`: every GPU whose NVML name matches (our extension)."""

    product: str


DeviceRef = GpuIndexRef | MigIndexRef | UuidRef | MigGiCiRef | ProductRef

DeviceSelection = Literal["all"] | int | tuple[DeviceRef, ...]
"""`all`, a count of devices (the first N), or an explicit list of references."""

_FORMS = (
    'a GPU index (0 or "0"), a MIG index ("0:1"), GPU-<uuid>, MIG-<uuid>, '
    "MIG-GPU-<uuid>/<gi>/<ci> or {product: <glob>}"
)


def _bad(index: int | None, message: str) -> PydanticCustomError:
    # The loader appends `index` to the error location so the line points at the list item.
    return PydanticCustomError("device_selection", "{detail}", {"detail": message, "index": index})


def _parse_ref(item: Any, index: int) -> DeviceRef:
    if isinstance(item, bool | float):
        raise _bad(index, f"{item!r} is not a device reference; use {_FORMS}")
    if isinstance(item, int):
        if item < 0:
            raise _bad(index, f"GPU index must be >= 0 (got {item})")
        return GpuIndexRef(item)
    if isinstance(item, dict):
        if set(item) != {"product"} or not isinstance(item["product"], str) or not item["product"]:
            raise _bad(index, "a product selector is exactly {product: <glob>}")
        return ProductRef(item["product"])
    if not isinstance(item, str):
        raise _bad(index, f"{item!r} is not a device reference; use {_FORMS}")
    if _INDEX.fullmatch(item):
        return GpuIndexRef(int(item))
    if match := _MIG_INDEX.fullmatch(item):
        return MigIndexRef(int(match[1]), int(match[2]))
    if _GPU_UUID.fullmatch(item) or _MIG_UUID.fullmatch(item):
        return UuidRef(item)
    if match := _MIG_GI_CI.fullmatch(item):
        return MigGiCiRef(match[1], int(match[2]), int(match[3]))
    hint = ""
    if item.startswith("MIG-GPU-"):
        hint = " (the old MIG form needs /<gi>/<ci>, e.g. MIG-GPU-<uuid>/1/0)"
    elif item.startswith(("GPU-", "MIG-")):
        hint = " (a UUID has the form 8-4-4-4-12 hex digits)"
    raise _bad(index, f"{item!r} is not a device reference{hint}; use {_FORMS}")


def parse_devices(value: Any) -> DeviceSelection:
    """Turn the YAML value of `devices:` into a DeviceSelection, or raise a precise error."""
    if isinstance(value, tuple) and all(
        isinstance(v, GpuIndexRef | MigIndexRef | UuidRef | MigGiCiRef | ProductRef) for v in value
    ):
        return value  # already parsed (model built in Python)
    if isinstance(value, str):
        if value != "all":
            raise _bad(None, f"{value!r} is not a device selection; use all, a count or a list")
        return "all"
    if isinstance(value, bool | float):
        raise _bad(None, f"{value!r} is not a device selection; use all, a count or a list")
    if isinstance(value, int):
        if value < 1:
            raise _bad(None, f"a device count must be >= 1 (got {value})")
        return value
    if isinstance(value, list | tuple):
        if not value:
            raise _bad(None, "an empty list selects no device; remove devices: to select all")
        refs: list[DeviceRef] = []
        for i, item in enumerate(value):
            ref = _parse_ref(item, i)
            if ref in refs:
                raise _bad(i, f"{describe_ref(ref)} is listed twice")
            refs.append(ref)
        return tuple(refs)
    raise _bad(None, f"{value!r} is not a device selection; use all, a count or a list")


def dump_ref(ref: DeviceRef) -> int | str | dict[str, str]:
    """The canonical YAML form of one reference (what `parse_devices` reads back)."""
    match ref:
        case GpuIndexRef(index):
            return index
        case MigIndexRef(gpu, mig):
            return f"{gpu}:{mig}"
        case UuidRef(uuid):
            return uuid
        case MigGiCiRef(gpu_uuid, gi, ci):
            return f"MIG-{gpu_uuid}/{gi}/{ci}"
        case ProductRef(product):
            return {"product": product}


def dump_devices(selection: DeviceSelection) -> str | int | list[int | str | dict[str, str]]:
    if isinstance(selection, tuple):
        return [dump_ref(ref) for ref in selection]
    return selection


def describe_ref(ref: DeviceRef) -> str:
    """How a reference reads in a message."""
    if isinstance(ref, GpuIndexRef):
        return f"GPU {ref.index}"
    if isinstance(ref, MigIndexRef):
        return f"MIG device {ref.gpu}:{ref.mig}"
    text = dump_ref(ref)
    return f"product {ref.product!r}" if isinstance(ref, ProductRef) else str(text)


def overlap(a: DeviceSelection, b: DeviceSelection) -> str | None:
    """What two selections certainly have in common, described; None when they may be disjoint.

    Only what is decidable without the node's inventory is reported here (an index and a UUID
    naming the same GPU are found when the plan meets the hardware).
    """
    if a == "all" or b == "all":
        return "all devices"
    if isinstance(a, int) and isinstance(b, int):
        return f"the first {min(a, b)} device(s)"
    if isinstance(a, int) or isinstance(b, int):
        count, refs = (a, b) if isinstance(a, int) else (b, a)
        assert isinstance(count, int) and isinstance(refs, tuple)
        for ref in refs:
            if isinstance(ref, GpuIndexRef) and ref.index < count:
                return describe_ref(ref)
            if isinstance(ref, MigIndexRef) and ref.gpu < count:
                return describe_ref(ref)
        return None
    assert isinstance(a, tuple) and isinstance(b, tuple)
    common = [ref for ref in a if ref in b]
    return describe_ref(common[0]) if common else None


DEVICES_JSON_SCHEMA: dict[str, Any] = {
    "description": (
        "Which devices: `all` (default), a count N (the first N devices), or a list of "
        "GPU indices, MIG indices `gpu:mig`, GPU-/MIG- UUIDs, MIG-GPU-<uuid>/<gi>/<ci>, "
        "or {product: <glob>}."
    ),
    "anyOf": [
        {"const": "all", "type": "string"},
        {"type": "integer", "minimum": 1},
        {
            "type": "array",
            "minItems": 1,
            "items": {
                "anyOf": [
                    {"type": "integer", "minimum": 0},
                    {
                        "type": "string",
                        "pattern": (
                            rf"^(\d+|\d+:\d+|GPU-{_UUID}|MIG-{_UUID}|MIG-GPU-{_UUID}/\d+/\d+)$"
                        ),
                    },
                    {
                        "type": "object",
                        "properties": {"product": {"type": "string", "minLength": 1}},
                        "required": ["product"],
                        "additionalProperties": False,
                    },
                ]
            },
        },
    ],
}
