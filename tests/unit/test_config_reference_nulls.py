"""A key written with no value (`key:`) means what the reference's Go decoders make of JSON null.

Most keys read as absent. Three are refused, because their Go types decode null themselves and
fail: `sharing.timeSlicing` (ReplicatedResources.UnmarshalJSON: "no resources specified"), a
sharing entry's `devices` (ReplicatedDevices: "devices set as '' but ...") and `rename`
(ResourceName: "incorrect format for resource name 'nvidia.com/'"). `sharing.mps` is a Go
pointer, which null leaves unset, so an empty `mps:` is absent there and here.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from sharing_plugin.config.compat import RefusedNull, without_nulls
from sharing_plugin.config.loader import parse_config, parse_configs
from sharing_plugin.config.messages import validation_problems
from sharing_plugin.config.model import Config
from sharing_plugin.config.yamldoc import read
from sharing_plugin.errors import ConfigError


def entry(lines: str, section: str = "timeSlicing") -> str:
    """One sharing entry; `lines` (indented 6) start on line 5."""
    return f"sharing:\n  {section}:\n    resources:\n    - name: gpu\n{lines}      replicas: 2\n"


REFUSED: dict[str, tuple[str, str, str, str]] = {
    # name: (text, LINE:COL, path, message start)
    "empty timeSlicing": (
        "version: v1\nsharing:\n  timeSlicing:\n",
        "3:3",
        "sharing.timeSlicing",
        "is empty: the reference plugin refuses it (no resources specified); list resources",
    ),
    "timeSlicing: null": (
        "sharing:\n  timeSlicing: null\n",
        "2:3",
        "sharing.timeSlicing",
        "is empty: the reference plugin refuses it (no resources specified)",
    ),
    "empty devices": (
        entry("      devices:\n"),
        "5:7",
        "sharing.timeSlicing.resources[0].devices",
        "is empty: the reference plugin refuses it (devices set as '' but the only valid "
        "string input is 'all'); write all, a count or a list",
    ),
    "empty devices under mps": (
        entry("      devices: ~\n", "mps"),
        "5:7",
        "sharing.mps.resources[0].devices",
        "is empty: the reference plugin refuses it (devices set as ''",
    ),
    "empty rename": (
        entry("      rename:\n"),
        "5:7",
        "sharing.timeSlicing.resources[0].rename",
        "is empty: the reference plugin refuses it (incorrect format for resource name "
        "'nvidia.com/'); write the name to advertise, or remove the key",
    ),
}

ABSENT: dict[str, tuple[str, Config]] = {
    "empty mps": ("sharing:\n  mps:\n", Config()),
    "empty sharing": ("sharing:\n", Config()),
    "empty plugin flags": ("flags:\n  plugin:\n", Config()),
    "empty imex channels": ("imex:\n  channelIDs:\n", Config.model_validate({"imex": {}})),
    "empty renameByDefault": (
        "sharing:\n  timeSlicing:\n    renameByDefault:\n"
        "    resources: [{name: gpu, replicas: 2}]\n",
        Config.model_validate(
            {"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2}]}}}
        ),
    ),
}


def problems(text: str) -> list[tuple[str, str, str]]:
    """(LINE:COL, path, message) of each problem, validated as the loader validates a config."""
    doc = read(text)
    try:
        Config.model_validate(without_nulls(doc.value), by_alias=True, by_name=False)
    except ValidationError as exc:
        return [
            (f"{mark.line + 1}:{mark.column + 1}", path, message)
            for path, message, mark in validation_problems(exc, doc)
        ]
    return []


@pytest.mark.parametrize("name", list(REFUSED))
def test_an_empty_key_the_reference_refuses_is_refused_at_its_key(name: str) -> None:
    text, where, path, says = REFUSED[name]
    ((got_where, got_path, message),) = problems(text)
    assert (got_where, got_path) == (where, path)
    assert message.startswith(says), message


@pytest.mark.parametrize("name", list(ABSENT))
def test_other_empty_keys_are_absent(name: str) -> None:
    text, expected = ABSENT[name]
    assert problems(text) == []
    assert Config.model_validate(without_nulls(read(text).value), by_alias=True) == expected


def test_only_the_refused_keys_keep_a_marker() -> None:
    value = {
        "flags": {"plugin": None, "migStrategy": None},
        "sharing": {
            "timeSlicing": None,
            "mps": {"resources": [{"name": "gpu", "devices": None, "rename": None, "x": None}]},
        },
        "list": [None, {"a": None}],
    }
    cleaned = without_nulls(value)
    assert cleaned["flags"] == {}
    assert isinstance(cleaned["sharing"]["timeSlicing"], RefusedNull)
    (mps_entry,) = cleaned["sharing"]["mps"]["resources"]
    assert set(mps_entry) == {"name", "devices", "rename"}
    assert all(isinstance(mps_entry[k], RefusedNull) for k in ("devices", "rename"))
    assert cleaned["list"] == [None, {}]  # list items are not keys: validation refuses them


def test_several_empty_keys_are_reported_together() -> None:
    text = entry("      devices:\n      rename:\n")
    assert [(w, p) for w, p, _ in problems(text)] == [
        ("5:7", "sharing.timeSlicing.resources[0].devices"),
        ("6:7", "sharing.timeSlicing.resources[0].rename"),
    ]


# Through the loader, which reads nulls with `compat.without_nulls`.


@pytest.mark.parametrize("name", list(REFUSED))
def test_the_loader_refuses_them_too(name: str) -> None:
    text, where, path, says = REFUSED[name]
    with pytest.raises(ConfigError) as raised:
        parse_config(text, file="c.yaml")
    (problem,) = raised.value.problems
    assert (f"{problem.line}:{problem.column}", problem.path) == (where, path)
    assert problem.message.startswith(says)


def test_the_loader_locates_them_in_a_configmap() -> None:
    manifest = (
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata:\n"
        "  ok: |\n    version: v1\n"
        "  empty: |\n    sharing:\n      timeSlicing:\n"
    )
    with pytest.raises(ConfigError) as raised:
        parse_configs(manifest, file="cm.yaml")
    (problem,) = raised.value.problems
    assert str(problem).startswith(
        "cm.yaml:9:7: data.empty: sharing.timeSlicing: is empty: the reference plugin refuses it"
    )
