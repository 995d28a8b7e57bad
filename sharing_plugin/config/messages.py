"""Pydantic errors turned into messages an admin can act on, each at its line and column.

Pydantic reports *where* as a `loc` tuple inside the data and *what* in its own words; the admin
needs file:line:col, the dotted path as written in the YAML, and a plain sentence with the fix
("did you mean 'renameByDefault'?", "belongs under sharing.timeSlicing"). Broken rules between
values arrive as issues, each with its own `loc` and sentence, and are placed by the same code,
so a field error and a broken rule read alike and come in one document order.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from pydantic import BaseModel, ValidationError
from yaml.nodes import MappingNode

from sharing_plugin.config.base import Issue, Loc, sections_in
from sharing_plugin.config.compat import RefusedNull
from sharing_plugin.config.model import MAX_DEVICES_PER_RESOURCE, Config
from sharing_plugin.config.yamldoc import Document, Mark


def format_loc(loc: Loc) -> str:
    """`("sharing", "mps", "resources", 0)` -> `sharing.mps.resources[0]`."""
    out = ""
    for part in loc:
        if isinstance(part, str) and not part.isprintable():
            # A quoted key with a newline or control character: keep the message one line.
            out += f"[{part!r}]"
            continue
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _sections() -> dict[tuple[str, ...], tuple[type[BaseModel], str]]:
    """Every section of the config: key path (without list indices) -> (model, display name)."""
    found: dict[tuple[str, ...], tuple[type[BaseModel], str]] = {}

    def walk(model: type[BaseModel], path: tuple[str, ...], display: str) -> None:
        found[path] = (model, display)
        for name, info in model.model_fields.items():
            for sub, is_list in sections_in(info.annotation):
                key = info.alias or name
                shown = f"{display}.{key}" if path else key
                walk(sub, (*path, key), f"entries of {shown}" if is_list else shown)

    walk(Config, (), "the top level")
    return found


_SECTIONS = _sections()


def _keys(model: type[BaseModel]) -> list[str]:
    return [info.alias or name for name, info in model.model_fields.items()]


def unknown_field_message(loc: Loc) -> str:
    key = str(loc[-1])
    section = tuple(p for p in loc[:-1] if isinstance(p, str))
    model, _ = _SECTIONS.get(section, (Config, ""))
    known = _keys(model)
    lowered = {k.lower(): k for k in known}
    if key.lower() in lowered:
        return f"unknown field {key!r} (did you mean {lowered[key.lower()]!r}?)"
    elsewhere = sorted(
        {
            display
            for path, (other, display) in _SECTIONS.items()
            if path != section and key.lower() in (k.lower() for k in _keys(other))
        }
    )
    if elsewhere:
        return f"unknown field {key!r} here: it belongs under {' or '.join(elsewhere)}"
    import difflib  # only a config with an error needs it: not at every start

    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    if close:
        return f"unknown field {key!r} (did you mean {close[0]!r}?)"
    return f"unknown field {key!r}; known fields here: {', '.join(known)}"


_TYPE_NAMES = {
    "int_type": "an integer",
    "bool_type": "true or false",
    "string_type": "a string",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "dict_type": "a mapping",
    "tuple_type": "a list",
    "list_type": "a list",
}


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return {dict: "a mapping", list: "a list", str: "a string", int: "an integer"}.get(
        type(value), f"a {type(value).__name__}"
    )


def _message(error: Any, loc: Loc) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    value = error.get("input")
    if isinstance(value, RefusedNull):
        return value.message
    if kind == "extra_forbidden":
        return unknown_field_message(loc)
    if kind == "missing":
        return f"required field {loc[-1]!r} is missing"
    if kind in _TYPE_NAMES:
        return f"must be {_TYPE_NAMES[kind]} (got {_kind(value)}: {value!r})"
    if kind == "greater_than_equal":
        return f"must be >= {ctx['ge']} (got {value!r})"
    if kind == "less_than_equal":
        why = ""
        if loc and loc[-1] == "replicas" and ctx["le"] == MAX_DEVICES_PER_RESOURCE:
            why = (
                ": one kubelet ListAndWatch message (4 MiB) carries about 60,000 devices "
                "per resource"
            )
        return f"must be <= {ctx['le']} (got {value!r}){why}"
    if kind == "too_short":
        return "must not be empty"
    if kind == "literal_error" and loc == ("version",):
        return f"unsupported version {value!r}; supported versions: v1"
    if kind in ("enum", "literal_error"):
        expected = ctx.get("expected", "")
        choices = [c.strip().strip("'") for c in expected.replace(" or ", ", ").split(",")]
        import difflib

        close = difflib.get_close_matches(str(value), choices, n=1, cutoff=0.5)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        if "eventTypes" in loc:  # the reference's own words for this one
            return f"invalid event type: {value}; expected {expected}{hint}"
        return f"unknown value {value!r}; expected {expected}{hint}"
    if kind == "string_pattern_mismatch" and "profiles" in loc:
        return f"{value!r} is not a MIG profile name (e.g. 1g.10gb, 3g.40gb, 1g.10gb+me)"
    return str(error["msg"])


def _errors(exc: ValidationError) -> Iterator[tuple[Loc, str, bool]]:
    """(loc, message, points at key) for every error."""
    for error in exc.errors(include_url=False):
        loc: Loc = tuple(error["loc"])
        ctx = error.get("ctx") or {}
        # An empty key has no value to point at: its key is where the reader looks.
        on_key = error["type"] == "extra_forbidden" or isinstance(error.get("input"), RefusedNull)
        if error["type"] == "device_selection" and ctx.get("index") is not None:
            loc = (*loc, ctx["index"])
        if loc and loc[-1] == "[key]":
            loc, on_key = loc[:-1], True
        yield loc, _message(error, loc), on_key


def locate(doc: Document, loc: Loc, *, on_key: bool) -> Mark:
    """The mark of the key or value at `loc`, or of its nearest ancestor that was written."""
    if loc in doc.keys and (on_key or isinstance(doc.nodes.get(loc), MappingNode)):
        return doc.keys[loc]  # a whole section is wrong: its key is where the reader looks
    if loc in doc.values:
        return doc.values[loc]
    for end in range(len(loc) - 1, -1, -1):
        # A missing or unwritten field: point at the closest section that was written.
        prefix = loc[:end]
        if prefix in doc.keys:
            return doc.keys[prefix]
        if prefix in doc.values and prefix:
            return doc.values[prefix]
    return doc.values.get((), Mark(0, 0))


def validation_problems(
    exc: ValidationError | None, doc: Document, issues: Iterable[Issue] = ()
) -> list[tuple[str, str, Mark]]:
    """(dotted path, message, mark) for each field error and each broken rule, in document
    order (at one position, field errors first: a broken rule and a field error never share
    one in practice, since a section is checked only when its own fields are valid)."""
    said = [
        *(_errors(exc) if exc is not None else ()),
        *((i.loc, i.message, False) for i in issues),
    ]
    found = [
        (format_loc(loc), message, locate(doc, loc, on_key=on_key)) for loc, message, on_key in said
    ]
    return sorted(found, key=lambda item: (item[2].line, item[2].column))
