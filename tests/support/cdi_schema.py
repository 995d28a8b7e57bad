"""The CDI specification's JSON schema, written from the spec (cncf-tags/container-device-
interface, SPEC.md, versions 0.5.0 to 0.8.0), to check the spec files the plugin writes.

Only what the spec says a runtime relies on: the version, `kind` as `<vendor>/<class>` with
the spec's name rules, devices named by its device name rule, each with `containerEdits`; env
entries `KEY=VALUE`; hooks with one of the spec's hook names and a path; mounts with both paths.
"""

from __future__ import annotations

from typing import Any

from jsonschema import Draft202012Validator

_VENDOR = r"[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?"
_CLASS = r"[A-Za-z0-9]([A-Za-z0-9_-]*[A-Za-z0-9])?"
_DEVICE = r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$"
HOOK_NAMES = (
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
)

_EDITS: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "env": {"type": "array", "items": {"type": "string", "pattern": "^[^=]+="}},
        "deviceNodes": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["path"],
                "properties": {"path": {"type": "string", "pattern": "^/"}},
            },
        },
        "hooks": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["hookName", "path"],
                "properties": {
                    "hookName": {"enum": list(HOOK_NAMES)},
                    "path": {"type": "string", "pattern": "^/"},
                    "args": {"type": "array", "items": {"type": "string"}},
                    "env": {"type": "array", "items": {"type": "string"}},
                    "timeout": {"type": "integer"},
                },
            },
        },
        "mounts": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["hostPath", "containerPath"],
                "properties": {
                    "hostPath": {"type": "string"},
                    "containerPath": {"type": "string", "pattern": "^/"},
                    "options": {"type": "array", "items": {"type": "string"}},
                    "type": {"type": "string"},
                },
            },
        },
        "intelRdt": {"type": "object"},
        "additionalGIDs": {"type": "array", "items": {"type": "integer"}},
    },
}

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "additionalProperties": False,
    "required": ["cdiVersion", "kind", "devices"],
    "properties": {
        "cdiVersion": {"enum": ["0.5.0", "0.6.0", "0.7.0", "0.8.0"]},
        "kind": {"type": "string", "pattern": f"^{_VENDOR}/{_CLASS}$"},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
        "devices": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["name", "containerEdits"],
                "properties": {
                    "name": {"type": "string", "pattern": _DEVICE},
                    "annotations": {"type": "object"},
                    "containerEdits": _EDITS,
                },
            },
        },
        "containerEdits": _EDITS,
    },
}


def cdi_problems(spec: object) -> list[str]:
    """Every way `spec` breaks the CDI specification's schema (empty: none)."""
    validator = Draft202012Validator(SCHEMA)
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(spec)
    ]
