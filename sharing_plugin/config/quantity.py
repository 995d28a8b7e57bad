"""GPU memory sizes written as Kubernetes quantities (`10Gi`, `512Mi`, `16G`), held in MiB.

MPS limits pinned memory in whole MiB (the reference writes `<n>M`), so a size is read once, at
load, into MiB, rounded down. A unit is required: a bare number would be bytes in Kubernetes
but is easily meant as MiB or GB, and a limit a thousand times off is worse than an error.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Annotated, Any

from pydantic import PlainSerializer, PlainValidator, WithJsonSchema
from pydantic_core import PydanticCustomError

MIB = 1 << 20
_UNITS = {
    "Ki": 1 << 10,
    "Mi": 1 << 20,
    "Gi": 1 << 30,
    "Ti": 1 << 40,
    "Pi": 1 << 50,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
}
# What a config may write: a unit is required, and no size of ours needs peta.
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)$"
_QUANTITY = re.compile(QUANTITY_PATTERN)
_ANY_QUANTITY = re.compile(r"([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?")


def quantity_bytes(text: str) -> int | None:
    """A Kubernetes quantity of bytes (`20Gi`, `512M`, or a plain number: bytes, as the API
    server writes one without a suffix) in whole bytes, rounded down; None when it is not one."""
    match = _ANY_QUANTITY.fullmatch(text.strip())
    if match is None:
        return None
    return int(Decimal(match.group(1)) * _UNITS.get(match.group(2) or "", 1))


def parse_mib(value: Any) -> int:
    """`10Gi` -> 10240: a quantity with its unit, in whole MiB (at least 1)."""
    if not isinstance(value, str) or isinstance(value, bool):
        raise PydanticCustomError(
            "memory_quantity",
            "{detail}",
            {"detail": f"write a size with its unit, e.g. 10Gi or 512Mi (got {value!r})"},
        )
    text = value.strip()
    match = _QUANTITY.match(text)
    if match is None:
        raise PydanticCustomError(
            "memory_quantity",
            "{detail}",
            {
                "detail": f"{text!r} is not a size: write a number and one of "
                f"{', '.join(u for u in _UNITS if u not in ('Pi', 'P'))}, e.g. 10Gi"
            },
        )
    mib = (quantity_bytes(text) or 0) // MIB
    if mib < 1:
        raise PydanticCustomError(
            "memory_quantity", "{detail}", {"detail": f"{text} is under 1Mi, the smallest limit"}
        )
    return mib


def dump_mib(mib: int) -> str:
    return f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi"


MemoryMiB = Annotated[
    int,
    PlainValidator(parse_mib),
    PlainSerializer(dump_mib),
    WithJsonSchema({"type": "string", "pattern": QUANTITY_PATTERN, "examples": ["10Gi"]}),
]
"""A GPU memory size in MiB, written as a Kubernetes quantity with its unit."""
