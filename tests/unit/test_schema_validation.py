"""The committed JSON Schema agrees with the validator, as a standard JSON Schema validator sees it.

Editors (and CI pipelines) check configs against `schemas/`; the plugin checks them with its
model. Every config the plugin accepts (the examples, the deploy ConfigMap, the valid cases of
the config tables) must pass the schema, and every refused one the schema can express must fail
it. Documents are read with the plugin's own YAML reader, so both sides see the same values.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import test_config_compat
import test_config_reference_nulls
import test_config_table
import yaml_fast
from jsonschema import Draft202012Validator

from sharing_plugin.config.yamldoc import read

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "schemas" / "sharing-config.v1.schema.json").read_text())
VALIDATOR = Draft202012Validator(SCHEMA)

TABLES = {"table": test_config_table, "compat": test_config_compat}

# Refused cases that the schema leaves to the validator, with why. The schema says what each
# value may be; a rule between two values (a contradiction, an overlap, a name used twice, a
# section that another one rules out) is the validator's, which words it with both places.
# Text-level refusals (duplicate keys, aliases, tags, syntax) never reach a schema: skipped.
_FLOAT = "a float with no fraction is an integer to JSON Schema; the plugin refuses it, as Go does"
_BETWEEN = "a rule between two values"
BEYOND_SCHEMA: dict[str, str] = {
    "compat: criticalXIDs float": _FLOAT,
    "table: devices 2.0": _FLOAT,
    "table: replicas as float": _FLOAT,
    "compat: disabled contradicts enabled": _BETWEEN,
    "compat: ignoredXIDs and ignoredXids": _BETWEEN,
    "compat: useNodeFeatureAPI in both places, contradicting": _BETWEEN,
    "compat: xid in both lists": _BETWEEN,
    "compat: xid in both lists, our spelling": _BETWEEN,
    "table: all overlaps everything": _BETWEEN,
    "table: both sharing modes": _BETWEEN,
    "table: devices listed twice": f"{_BETWEEN}: 0 and '0' are the same GPU",
    "table: mps with mixed MIG": f"{_BETWEEN}: flags.migStrategy and sharing.mps",
    "table: overlapping selections": _BETWEEN,
    "table: partitioning overlap": _BETWEEN,
    "table: rename collision": _BETWEEN,
}


def schema_problems(value: Any) -> list[str]:
    return [
        f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
        for e in VALIDATOR.iter_errors(value)
    ]


def _configmap_configs(path: Path) -> Iterator[tuple[str, str]]:
    for doc in yaml_fast.load_all(path.read_text()):
        if isinstance(doc, dict) and doc.get("kind") == "ConfigMap":
            for key, text in (doc.get("data") or {}).items():
                yield f"{path.relative_to(ROOT)}:data.{key}", text


def shipped_configs() -> dict[str, str]:
    found = {
        str(p.relative_to(ROOT)): p.read_text()
        for p in (ROOT / "config" / "examples").glob("*.yaml")
    }
    for manifest in sorted((ROOT / "deploy").rglob("*.yaml")):
        found.update(_configmap_configs(manifest))
    return found


SHIPPED = shipped_configs()


def table_cases(kind: str) -> dict[str, str]:
    """The text of every case of that kind (`Valid` or `Invalid`) of both tables."""
    return {
        f"{table}: {name}": case.text
        for table, module in TABLES.items()
        for name, case in module.CASES.items()
        if isinstance(case, getattr(module, kind))
    }


VALID = {
    **table_cases("Valid"),
    **{f"nulls: {n}": text for n, (text, _) in test_config_reference_nulls.ABSENT.items()},
}
INVALID = {
    **table_cases("Invalid"),
    **{f"nulls: {n}": case[0] for n, case in test_config_reference_nulls.REFUSED.items()},
}


def document(text: str) -> Any:
    """What the validator sees: the plain value of the document, nulls included."""
    return read(text).value


def test_the_schema_is_a_valid_2020_12_schema() -> None:
    Draft202012Validator.check_schema(SCHEMA)


def test_every_shipped_config_is_found() -> None:
    assert any(name.startswith("deploy/configmap.yaml:data.") for name in SHIPPED)
    assert "config/examples/reference-readme.yaml" in SHIPPED
    assert len(VALID) >= 40 and len(INVALID) >= 40


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_configs_pass_the_schema(name: str) -> None:
    assert schema_problems(document(SHIPPED[name])) == []


@pytest.mark.parametrize("name", sorted(VALID))
def test_accepted_configs_pass_the_schema(name: str) -> None:
    value = document(VALID[name])
    if value is None:
        pytest.skip("an empty document is no JSON value; the plugin reads it as all defaults")
    assert schema_problems(value) == []


def _readable(text: str) -> Any:
    try:
        return document(text)
    except Exception:  # syntax, aliases, duplicate keys: refused before any schema applies
        return None


@pytest.mark.parametrize("name", sorted(INVALID))
def test_refused_configs_fail_the_schema_where_it_can_say_so(name: str) -> None:
    value = _readable(INVALID[name])
    if value is None:
        pytest.skip("not a YAML mapping the schema could be applied to")
    if name in BEYOND_SCHEMA:
        return
    assert schema_problems(value) != [], f"the schema accepts a config the plugin refuses: {name}"


def test_beyond_schema_names_only_cases_the_schema_accepts() -> None:
    # A listed case that the schema now refuses (or that no longer exists) is stale.
    stale = {
        name
        for name in BEYOND_SCHEMA
        if name not in INVALID or schema_problems(_readable(INVALID[name])) != []
    }
    assert stale == set()


def _nodes(node: Any, path: str = "#") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        yield path, node
        for key, child in node.items():
            yield from _nodes(child, f"{path}/{key}")
    elif isinstance(node, list):
        for i, child in enumerate(node):
            yield from _nodes(child, f"{path}/{i}")


def _target(node: dict[str, Any]) -> dict[str, Any] | None:
    refs = [node.get("$ref")] + [b.get("$ref") for b in node.get("anyOf", ())]
    for ref in refs:
        if ref:
            return SCHEMA["$defs"][ref.removeprefix("#/$defs/")]  # type: ignore[no-any-return]
    return None


def test_every_object_and_every_section_has_a_description() -> None:
    missing = []
    for path, node in _nodes(SCHEMA):
        is_object = node.get("type") == "object" or "properties" in node
        if is_object and not node.get("description"):
            missing.append(path)
    for owner, node in [("#", SCHEMA), *((f"#/$defs/{n}", d) for n, d in SCHEMA["$defs"].items())]:
        for key, prop in node.get("properties", {}).items():
            if _target(prop) is not None and not prop.get("description"):
                missing.append(f"{owner}/properties/{key}")
    assert missing == []


def test_every_definition_has_a_description() -> None:
    # Editors show a definition's description on hover wherever it is referenced; an enum
    # without one shows only its values.
    assert [name for name, node in SCHEMA["$defs"].items() if not node.get("description")] == []


def test_top_level_sections_say_what_they_are() -> None:
    sections = SCHEMA["properties"]
    for key in ("flags", "sharing", "health", "resources", "partitioning", "imex"):
        assert sections[key].get("description"), key
    for key in ("timeSlicing", "mps"):
        assert SCHEMA["$defs"]["SharingSection"]["properties"][key].get("description"), key


# A keyword of one type on a schema of another is ignored by validators: a silent hole.
_OF_TYPE = {
    "string": {"minLength", "maxLength", "pattern"},
    "array": {"minItems", "maxItems", "items", "prefixItems", "uniqueItems"},
    "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"},
}
_OF_TYPE["integer"] = _OF_TYPE["number"]


def test_no_keyword_applies_to_a_type_it_cannot_constrain() -> None:
    wrong = []
    for path, node in _nodes(SCHEMA):
        kinds = node.get("type")
        kinds = {kinds} if isinstance(kinds, str) else set(kinds or ())
        if not kinds or "object" in kinds:
            continue
        own = set().union(*(_OF_TYPE.get(k, set()) for k in kinds))
        foreign = set().union(*_OF_TYPE.values()) - own
        wrong += [f"{path}: {kw} on {sorted(kinds)}" for kw in sorted(foreign & node.keys())]
    assert wrong == []


@pytest.mark.parametrize(
    "strategy",
    ["envvar", "volume-mounts", ["envvar"], ["volume-mounts", "cdi-annotations"]],
    ids=str,
)
def test_device_list_strategy_is_one_or_a_list(strategy: object) -> None:
    config = {"flags": {"plugin": {"deviceListStrategy": strategy}}}
    assert schema_problems(config) == []


@pytest.mark.parametrize("strategy", ["env", [], ["envvar", "nope"], 3], ids=str)
def test_device_list_strategy_refusals(strategy: object) -> None:
    config = {"flags": {"plugin": {"deviceListStrategy": strategy}}}
    assert schema_problems(config) != []
