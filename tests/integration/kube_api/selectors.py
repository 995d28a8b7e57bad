"""Merge patches and selectors, as kube-apiserver reads them."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping
from typing import Any

from .status import bad_request

Match = Callable[[dict[str, Any]], bool]


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge key by key, null deletes, anything else replaces.
    Returns a new value; `target` is not changed."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _split_terms(selector: str) -> list[str]:
    terms, depth, current = [], 0, ""
    for char in selector:
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
            continue
        depth += {"(": 1, ")": -1}.get(char, 0)
        current += char
    terms.append(current)
    return [t.strip() for t in terms if t.strip()]


_LABEL_TERM = re.compile(
    r"(?P<neg>!)?\s*(?P<key>[A-Za-z0-9./_-]+)\s*"
    r"(?:(?P<op>==|=|!=)\s*(?P<value>[A-Za-z0-9._-]*)"
    r"|\s+(?P<set>in|notin)\s*\((?P<values>[^)]*)\))?"
)


def label_selector(selector: str) -> Callable[[Mapping[str, str]], bool]:
    tests: list[Callable[[Mapping[str, str]], bool]] = []
    for term in _split_terms(selector):
        m = _LABEL_TERM.fullmatch(term)
        if m is None or (m["neg"] and (m["op"] or m["set"])):
            raise bad_request(f"unable to parse requirement: invalid label selector: {term!r}")
        key, op, value = m["key"], m["op"], m["value"]
        if m["neg"]:
            tests.append(lambda labels, k=key: k not in labels)
        elif op in ("=", "=="):
            tests.append(lambda labels, k=key, v=value: labels.get(k) == v)
        elif op == "!=":
            tests.append(lambda labels, k=key, v=value: labels.get(k) != v)
        elif m["set"]:
            values = frozenset(v.strip() for v in m["values"].split(","))
            if m["set"] == "in":
                tests.append(lambda labels, k=key, vs=values: k in labels and labels[k] in vs)
            else:
                tests.append(lambda labels, k=key, vs=values: labels.get(k) not in vs)
        else:
            tests.append(lambda labels, k=key: k in labels)
    return lambda labels: all(test(labels) for test in tests)


def _field_value(obj: dict[str, Any], path: str) -> str:
    if path == "source":
        path = "source.component"
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if path == "spec.unschedulable":
        return "true" if value else "false"
    return "" if value is None else str(value)


FieldTerms = list[tuple[str, bool, str]]


def field_terms(supported: tuple[str, ...], selector: str) -> FieldTerms:
    """(field, equal?, value) for each term of a field selector over `supported` fields."""
    terms = []
    for term in _split_terms(selector):
        m = re.fullmatch(r"([A-Za-z.]+)\s*(==|=|!=)\s*(.*)", term)
        if m is None:
            raise bad_request(f"invalid field selector: {term!r}")
        name, op, value = m.groups()
        if name not in supported:
            raise bad_request(f"field label not supported: {name}")
        terms.append((name, op != "!=", value.strip()))
    return terms


def selector_name(terms: FieldTerms) -> str | None:
    """The name a list/watch asks for (kube-apiserver puts it into the authorization check)."""
    for name, equal, value in terms:
        if name == "metadata.name" and equal:
            return value
    return None


def matcher(query: Mapping[str, str], terms: FieldTerms) -> Match:
    """Whether an object matches the request's label selector and field terms."""
    labels = label_selector(query.get("labelSelector", ""))

    def match(obj: dict[str, Any]) -> bool:
        return labels(obj["metadata"].get("labels") or {}) and all(
            (_field_value(obj, f) == value) == equal for f, equal, value in terms
        )

    return match
