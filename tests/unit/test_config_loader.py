"""Loading from files, ConfigMap manifests and mounted directories; named-config selection."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sharing_plugin.config.loader import parse_config, parse_configs
from sharing_plugin.config.selection import select
from sharing_plugin.errors import ConfigError
from sharing_plugin.sources.files import load_configs

MANIFEST = """\
apiVersion: v1
kind: ConfigMap
metadata:
  name: sharing-plugin-config
data:
  default: |
    version: v1
  broken: |
    version: v1
    sharing:
      timeSlicing:
        resources:
        - name: gpu
          replicas: 0
  typo: |-
    flags:
      migStrategy: mixd
  inline: "flags: {migStrateg: none}"
"""


def problems(exc: pytest.ExceptionInfo[ConfigError]) -> list[str]:
    return [str(p) for p in exc.value.problems]


def test_configmap_problems_point_into_the_manifest() -> None:
    with pytest.raises(ConfigError) as raised:
        parse_configs(MANIFEST, file="cm.yaml")
    assert problems(raised) == [
        "cm.yaml:14:21: data.broken: sharing.timeSlicing.resources[0].replicas: "
        "must be >= 1 (got 0)",
        "cm.yaml:17:20: data.typo: flags.migStrategy: unknown value 'mixd'; "
        "expected 'none', 'single' or 'mixed' (did you mean 'mixed'?)",
        "cm.yaml:18:20: data.inline: flags.migStrateg: unknown field 'migStrateg' "
        "(did you mean 'migStrategy'?)",
    ]


def test_configmap_gives_one_config_per_key_with_prefixed_warnings() -> None:
    text = MANIFEST.split("  broken:")[0] + (
        "  shared: |\n    sharing:\n      timeSlicing:\n"
        "        resources: [{name: gpu, replicas: 1}]\n"
    )
    configs = parse_configs(text, file="cm.yaml")
    assert list(configs) == ["default", "shared"]
    assert (
        configs["shared"]
        .warnings[0]
        .startswith("data.shared: sharing.timeSlicing.resources[0].replicas: 1 means not shared")
    )
    assert configs["default"].source_hash != configs["shared"].source_hash


def test_configmap_without_data_is_an_error() -> None:
    with pytest.raises(ConfigError) as raised:
        parse_configs("kind: ConfigMap\napiVersion: v1\n", file="cm.yaml")
    assert "the ConfigMap has no data" in problems(raised)[0]


def test_plain_file_is_one_unnamed_config(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("version: v1\n")
    configs = load_configs(path)
    assert list(configs) == [None]
    assert configs[None].file == str(path)


def test_mounted_configmap_directory(tmp_path: Path) -> None:
    # kubelet's layout: ..<timestamp>/ holds the files, ..data -> it, each key -> ..data/key
    stamp = tmp_path / "..2024_01_01_00_00_00.000"
    stamp.mkdir()
    (stamp / "default").write_text("version: v1\n")
    (stamp / "mps").write_text("sharing:\n  mps:\n    resources: [{name: gpu, replicas: 0}]\n")
    os.symlink(stamp.name, tmp_path / "..data")
    for key in ("default", "mps"):
        os.symlink(f"..data/{key}", tmp_path / key)
    with pytest.raises(ConfigError) as raised:
        load_configs(tmp_path)
    assert problems(raised) == [
        f"{tmp_path / 'mps'}:3:39: sharing.mps.resources[0].replicas: must be >= 1 (got 0)"
    ]
    (stamp / "mps").write_text("sharing:\n  mps:\n    resources: [{name: gpu, replicas: 2}]\n")
    assert list(load_configs(tmp_path)) == ["default", "mps"]


def test_empty_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="holds no config"):
        load_configs(tmp_path)


def test_file_over_one_mib_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_bytes(b"# " + b"x" * (1024 * 1024) + b"\n")
    with pytest.raises(ConfigError) as raised:
        load_configs(path)
    assert problems(raised) == [f"{path}:1:1: file is over 1 MiB; a config may be at most 1 MiB"]
    with pytest.raises(ConfigError, match="at most 1 MiB"):
        parse_config(path.read_bytes(), file="big.yaml")


def test_non_utf8_is_refused_at_its_byte() -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(b"version: v1\nflags:\n  nvidiaDriverRoot: /d\xff\n", file="c.yaml")
    assert problems(raised) == ["c.yaml:3:23: not UTF-8 (byte 0xff); save the file as UTF-8"]


def test_unreadable_path_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_configs(tmp_path / "missing.yaml")


def test_source_hash_follows_the_text() -> None:
    a = parse_config("version: v1\n", file="a")
    b = parse_config("version: v1 # same meaning\n", file="a")
    assert a.config == b.config
    assert a.source_hash != b.source_hash
    assert a.source_hash == parse_config(b"version: v1\n", file="b").source_hash


# --- selection -------------------------------------------------------------------------------


@pytest.fixture
def named() -> dict[str | None, object]:
    text = "kind: ConfigMap\ndata:\n  default: ''\n  a: ''\n  b: ''\n"
    return dict(parse_configs(text, file="cm.yaml"))


@pytest.mark.parametrize(
    ("label", "requested", "chosen"),
    [("a", "b", "a"), (None, "b", "b"), (None, None, "default"), ("", None, "default")],
)
def test_select_fallbacks(
    named: dict, label: str | None, requested: str | None, chosen: str
) -> None:  # type: ignore[type-arg]
    name, loaded = select(named, label, requested)
    assert name == chosen
    assert loaded is named[chosen]


def test_select_only_key_without_default() -> None:
    configs = parse_configs("kind: ConfigMap\ndata:\n  only: ''\n", file="cm.yaml")
    assert select(configs, None, None)[0] == "only"


def test_select_unknown_name_lists_available(named: dict) -> None:  # type: ignore[type-arg]
    with pytest.raises(ConfigError) as raised:
        select(named, "c", None)
    assert problems(raised) == ["unknown config name 'c' (node label); available: default, a, b"]


def test_select_ambiguous_without_default() -> None:
    configs = parse_configs("kind: ConfigMap\ndata:\n  a: ''\n  b: ''\n", file="cm.yaml")
    with pytest.raises(ConfigError, match=r"no config selected.*available: a, b"):
        select(configs, None, None)


def test_select_plain_file_ignores_names() -> None:
    configs = parse_configs("version: v1\n", file="c.yaml")
    assert select(configs, "whatever", "other")[0] is None


def test_empty_sections_mean_not_set() -> None:
    loaded = parse_config("version: v1\nflags:\nsharing:\n  mps:\n", file="c.yaml")
    assert loaded.config.sharing.active is None


def test_select_near_miss_suggests_the_name() -> None:
    configs = parse_configs("kind: ConfigMap\ndata:\n  default: ''\n  shared: ''\n", file="c")
    with pytest.raises(ConfigError) as raised:
        select(configs, None, "sahred")
    assert problems(raised) == [
        "unknown config name 'sahred' (requested; did you mean 'shared'?); "
        "available: default, shared"
    ]
    with pytest.raises(ConfigError) as raised:
        select(configs, "Shared", None)
    assert problems(raised) == [
        "unknown config name 'Shared' (node label; did you mean 'shared'?); "
        "available: default, shared"
    ]


# --- located warnings ------------------------------------------------------------------------


def test_warnings_carry_the_line_of_their_entry() -> None:
    loaded = parse_config(
        "version: v1\nflags:\n  gdsEnabled: true\nsharing:\n  timeSlicing:\n"
        "    resources:\n      - name: gpu\n        replicas: 1\n",
        file="c.yaml",
    )
    # The wording is the warnings' own; only the location leads.
    assert loaded.located_warnings == tuple(
        f"c.yaml:{at}: {warning}"
        for at, warning in zip(("3:3", "8:9"), loaded.warnings, strict=True)
    )
    assert loaded.warnings[1].startswith("sharing.timeSlicing.resources[0].replicas: 1 means")
    # A later warning about an entry (from the plan) is located the same way; others stay.
    assert loaded.locate("sharing.timeSlicing.resources[0].name: no gpu here") == (
        "c.yaml:7:9: sharing.timeSlicing.resources[0].name: no gpu here"
    )
    assert loaded.locate("GPU 3 did not answer: no GPUs") == "GPU 3 did not answer: no GPUs"


def test_warnings_in_a_manifest_are_at_the_manifest_line() -> None:
    configs = parse_configs(
        "kind: ConfigMap\ndata:\n  a: |\n    flags:\n      gdsEnabled: true\n  b: 'imex: {}'\n",
        file="cm.yaml",
    )
    assert configs["a"].located_warnings == (
        "cm.yaml:5:7: data.a: flags.gdsEnabled: accepted for compatibility; has no effect here",
    )
    assert configs["b"].located_warnings == (
        "cm.yaml:6:7: data.b: imex: accepted for compatibility; has no effect here",
    )
    assert configs["a"].warnings == (
        "data.a: flags.gdsEnabled: accepted for compatibility; has no effect here",
    )


def test_notes_say_what_the_reference_binary_would_not_do_located_like_warnings() -> None:
    configs = parse_configs(
        "kind: ConfigMap\ndata:\n  a: |\n    sharing:\n      timeSlicing:\n"
        "        resources:\n        - name: gpu\n          rename: gpu.ts\n"
        "          replicas: 2\n  b: 'version: v1'\n",
        file="cm.yaml",
    )
    (note,) = configs["a"].notes
    assert note.startswith("data.a: sharing.timeSlicing.resources[0].rename: ")
    assert "advertises nvidia.com/gpu, not nvidia.com/gpu.ts" in note
    assert configs["a"].located_notes == (f"cm.yaml:8:11: {note}",)
    assert configs["a"].warnings == ()  # a note is not a warning
    assert configs["b"].notes == configs["b"].located_notes == ()


# --- multi-document streams ------------------------------------------------------------------


def test_stream_reads_each_config_document_and_skips_other_kinds() -> None:
    text = (
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: x}\n"
        "---\n" + MANIFEST.split("  broken:")[0] + "  gds: |\n    flags: {gdsEnabled: true}\n"
        "---\n"
        "---\n"
        "kind: DaemonSet\nspec: &s {a: 1}\nother: *s\n"
    )
    configs = parse_configs(text, file="all.yaml")
    assert list(configs) == ["default", "gds"]
    assert configs["gds"].located_warnings == (
        "all.yaml:13:13: data.gds: flags.gdsEnabled: accepted for compatibility; has no effect "
        "here",
    )


def test_stream_names_several_configs_by_document() -> None:
    text = (
        "version: v1\n---\nkind: ConfigMap\nmetadata: {name: a}\ndata: {x: ''}\n"
        "---\nkind: ConfigMap\ndata: {x: ''}\n"
    )
    assert list(parse_configs(text, file="f")) == ["document 1", "configmap/a/x", "document 3/x"]
    with pytest.raises(ConfigError) as raised:
        parse_configs(text.replace("version: v1", "versio: v1"), file="f")
    assert problems(raised) == [
        "f:1:1: document 1: versio: unknown field 'versio' (did you mean 'version'?)"
    ]


def test_single_document_with_a_leading_separator_is_not_a_stream() -> None:
    with pytest.raises(ConfigError) as raised:
        parse_configs("# a comment\n---\nflags: {migStrategy: mixd}\n", file="c.yaml")
    assert problems(raised)[0].startswith("c.yaml:3:22: flags.migStrategy: unknown value 'mixd'")


def test_stream_of_nothing_is_an_error() -> None:
    with pytest.raises(ConfigError) as raised:
        parse_configs("---\n---\n", file="f")
    assert problems(raised) == [
        "f:1:1: no ConfigMap and no config among the 2 documents of this stream; give the "
        "plugin's ConfigMap manifest or a config file"
    ]
