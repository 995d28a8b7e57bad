"""The JSON Schema of the config, generated from the model (editors use it for help).

The committed `schemas/sharing-config.v1.schema.json` is this text; a test fails when they
drift, so the schema can never document a field the model does not accept. What pydantic
generates is completed here where, read by a standard validator, it would disagree with the
loader, once for every section rather than field by field:

- a key written with no value (`flags:` with every line under it commented out) reads as absent,
  so an optional key also takes null, except where the reference's decoder refuses null (the
  compatibility rules say where, and this asks them rather than repeating them);
- a mapping whose keys follow a pattern (MIG profiles) takes no other keys, as the model refuses
  them;
- a key that holds a section carries the section's description, so an editor shows it on hover.

A field's description is the docstring written under it in the model. Pydantic can read those
itself (`use_attribute_docstrings`), but only by parsing every model's source when the class is
built, which is most of the cost of importing the model; they are read here instead, when a
schema is asked for, so loading and validating a config pays nothing for them.
"""

from __future__ import annotations

import ast
import copy
import inspect
import json
import textwrap
import types
import typing
from typing import Any

from pydantic import BaseModel

from sharing_plugin.config.compat import without_nulls
from sharing_plugin.config.model import Config

SCHEMA_ID = "https://github.com/gpu-sharing-plugin/schemas/sharing-config.v1.schema.json"

# Keywords that describe a value rather than constrain it: they stay beside `anyOf` when a
# schema is made to accept null too.
_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "deprecated"})
_NULL = {"type": "null"}

DocPath = tuple[str | int, ...]


def config_schema() -> dict[str, Any]:
    # A copy: pydantic may hand out the very dicts the field types declare.
    schema = copy.deepcopy(Config.model_json_schema(by_alias=True, mode="validation"))
    _add_field_docs(schema)
    _Completion(schema.get("$defs", {})).visit(schema, (), ())
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        **schema,
        "title": "gpu-sharing-plugin config (v1)",
        "description": (
            "One named config of the sharing plugin: the NVIDIA k8s-device-plugin v1 format "
            "plus declared MIG layouts, per-GPU replicas and health settings."
        ),
    }


def schema_text() -> str:
    """The schema exactly as committed: 2-space JSON, sorted keys, trailing newline."""
    return json.dumps(config_schema(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def null_reads_as_absent(path: DocPath) -> bool:
    """Whether `key:` with no value at `path` (list items as index 0) means "not set"."""
    doc: Any = None
    for key in reversed(path):
        doc = [doc] if isinstance(key, int) else {key: doc}
    kept = without_nulls(doc)
    for key in path[:-1]:
        kept = kept[key]
    return path[-1] not in kept


class _Completion:
    """One walk over the schema, following `$ref`s, with a document path for every value."""

    def __init__(self, defs: dict[str, Any]) -> None:
        self._defs = defs
        # A section used at several places must get the same answer at each.
        self._nullable: dict[tuple[int, str], tuple[bool, DocPath]] = {}

    def visit(self, node: dict[str, Any], path: DocPath, within: tuple[str, ...]) -> None:
        ref = node.get("$ref")
        if isinstance(ref, str):
            name = ref.removeprefix("#/$defs/")
            if name not in within:
                self.visit(self._defs[name], path, (*within, name))
        for branch in node.get("anyOf", ()):
            self.visit(branch, path, within)
        if isinstance(node.get("items"), dict):
            self.visit(node["items"], (*path, 0), within)
        required = set(node.get("required", ()))
        for key, value in node.get("properties", {}).items():
            if key not in required:
                self._set_nullable(node, key, value, (*path, key))
            self._describe(value)
            self.visit(value, (*path, key), within)
        if "patternProperties" in node:
            node.setdefault("additionalProperties", False)
            for value in node["patternProperties"].values():
                # Any key the pattern allows stands for them all.
                self._set_nullable(node, "*", value, (*path, "*"))
                self.visit(value, (*path, "*"), within)

    def _set_nullable(
        self, owner: dict[str, Any], key: str, node: dict[str, Any], at: DocPath
    ) -> None:
        nullable = null_reads_as_absent(at)
        seen = self._nullable.setdefault((id(owner), key), (nullable, at))
        if seen[0] != nullable:
            raise ValueError(
                f"{key!r} reads null as absent at {seen[1]} but not at {at}: one schema "
                "cannot say both"
            )
        if nullable and not _accepts_null(node):
            if "anyOf" in node:
                node["anyOf"].append(dict(_NULL))
            elif isinstance(node.get("type"), str) and not {"enum", "const"} & node.keys():
                node["type"] = [node["type"], "null"]
            else:
                core = {k: node.pop(k) for k in list(node) if k not in _ANNOTATIONS}
                node["anyOf"] = [core, dict(_NULL)]
        elif not nullable and _accepts_null(node):
            branches = [b for b in node.get("anyOf", ()) if b != _NULL]
            del node["anyOf"]
            if len(branches) == 1:
                node.update(branches[0])
            else:
                node["anyOf"] = branches
            if "default" in node and node["default"] is None:
                del node["default"]

    def _describe(self, node: dict[str, Any]) -> None:
        if node.get("description"):
            return
        for candidate in (node, *node.get("anyOf", ())):
            ref = candidate.get("$ref")
            if isinstance(ref, str):
                target = self._defs[ref.removeprefix("#/$defs/")]
                if target.get("description"):
                    node["description"] = target["description"]
                    return


def _add_field_docs(schema: dict[str, Any]) -> None:
    """Each property of each section gets the docstring under its field, as its description."""
    defs = schema.get("$defs", {})
    for model in _models(Config):
        target = schema if model is Config else defs.get(model.__name__)
        if target is None:
            continue
        docs = _field_docs(model)
        properties = target.get("properties", {})
        for name, field in model.model_fields.items():
            key = field.alias or name
            if name in docs and key in properties and field.description is None:
                properties[key]["description"] = docs[name]


def _models(root: type[BaseModel]) -> list[type[BaseModel]]:
    """`root` and every model its fields hold, however deep in unions, tuples or mappings."""
    found: list[type[BaseModel]] = []
    pending: list[Any] = [root]
    while pending:
        kind = pending.pop()
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            if kind not in found:
                found.append(kind)
                pending.extend(field.annotation for field in kind.model_fields.values())
        elif isinstance(kind, types.UnionType) or typing.get_origin(kind) is not None:
            pending.extend(typing.get_args(kind))
    return found


def _field_docs(model: type[BaseModel]) -> dict[str, str]:
    """The string literal right under each annotated field, inherited ones first."""
    docs: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if isinstance(cls, type) and issubclass(cls, BaseModel) and cls is not BaseModel:
            docs.update(_own_field_docs(cls))
    return docs


def _own_field_docs(cls: type) -> dict[str, str]:
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # no source to read (a frozen or generated class)
        return {}
    body = ast.parse(source).body[0]
    if not isinstance(body, ast.ClassDef):
        return {}
    docs: dict[str, str] = {}
    for statement, following in zip(body.body, body.body[1:], strict=False):
        if (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[statement.target.id] = inspect.cleandoc(following.value.value)
    return docs


def _accepts_null(node: dict[str, Any]) -> bool:
    kind = node.get("type")
    return (
        _NULL in node.get("anyOf", ())
        or kind == "null"
        or (isinstance(kind, list) and "null" in kind)
    )
