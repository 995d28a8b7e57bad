"""The parts of apimachinery's validation that a label-writing client can trip over: qualified
names (label and annotation keys), label values, string maps."""

from __future__ import annotations

import json
import re
from typing import Any

from .status import bad_request

NAME_PART = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_LABEL_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "
    "'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?"
    "[A-Za-z0-9])?')"
)
_NAME_PART_MSG = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
    "with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used "
    "for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)


def qualified_name_errors(key: str) -> list[str]:
    prefix, slash, name = key.rpartition("/")
    errors = []
    if slash and (len(prefix) > 253 or not re.fullmatch(DNS_SUBDOMAIN, prefix)):
        errors.append("prefix part must be a lowercase RFC 1123 subdomain")
    if not name:
        errors.append("name part must be non-empty")
    elif len(name) > 63:
        errors.append("name part must be no more than 63 characters")
    elif not re.fullmatch(NAME_PART, name):
        errors.append(_NAME_PART_MSG)
    return errors


def label_value_errors(value: str) -> list[str]:
    errors = []
    if len(value) > 63:
        errors.append("must be no more than 63 characters")
    if value and not re.fullmatch(NAME_PART, value):
        errors.append(_LABEL_VALUE_MSG)
    return errors


def check_string_map(value: Any, where: str) -> None:
    """A map of strings to strings, or a 400 (the real server cannot even decode it)."""
    if value is None:
        return
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise bad_request(f"{where}: expected a map of strings to strings, got {json.dumps(value)}")


def metadata_errors(obj: dict[str, Any]) -> list[tuple[str, str]]:
    """Shape errors of labels and annotations raise a 400; rule errors are returned (422)."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        raise bad_request("metadata: expected an object")
    labels = meta.get("labels")
    annotations = meta.get("annotations")
    check_string_map(labels, "metadata.labels")
    check_string_map(annotations, "metadata.annotations")
    errors: list[tuple[str, str]] = []
    for key, value in (labels or {}).items():
        for text in qualified_name_errors(key):
            errors.append(("metadata.labels", f'Invalid value: "{key}": {text}'))
        for text in label_value_errors(value):
            errors.append(("metadata.labels", f'Invalid value: "{value}": {text}'))
    for key in annotations or {}:
        for text in qualified_name_errors(key.lower()):
            errors.append(("metadata.annotations", f'Invalid value: "{key}": {text}'))
    return errors
