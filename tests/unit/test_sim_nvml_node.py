"""Parsing simulated node descriptions and their fault lists."""

from __future__ import annotations

from pathlib import Path

import pytest

from sharing_plugin.errors import ConfigError
from sharing_plugin.sim.nvml.node import (
    Fault,
    load_node_file,
    load_preset,
    parse_instance,
    preset_names,
    read_faults,
)


def test_instances_may_carry_a_start() -> None:
    assert parse_instance("3g.40gb") == ("3g.40gb", None)
    assert parse_instance("1g.10gb@6") == ("1g.10gb", 6)
    with pytest.raises(ValueError, match="must be a number"):
        parse_instance("1g.10gb@six")


def test_every_preset_parses_and_names_itself() -> None:
    for name in preset_names():
        loaded = load_preset(name)
        assert loaded.identity == name and loaded.path is None
        assert loaded.description.gpus


def test_defaults_of_a_minimal_file(tmp_path: Path) -> None:
    path = tmp_path / "lab-node.yaml"
    path.write_text("gpus:\n  - product: Tesla T4\n")
    loaded = load_node_file(path)
    assert loaded.identity == "lab-node"
    (group,) = loaded.description.gpus
    assert (group.count, group.numa_node, group.mig) == (1, None, None)
    assert loaded.description.nvlink == "none"
    assert loaded.description.faults == ()


def test_an_explicit_name_seeds_the_identity(tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    path.write_text("name: rack7-node3\ngpus: [{product: Tesla T4}]\n")
    assert load_node_file(path).identity == "rack7-node3"


@pytest.mark.parametrize(
    ("text", "path", "message"),
    [
        ("gpus: []\n", "gpus", "at least 1"),
        ("gpus: [{product: Tesla T4, count: 0}]\n", "gpus[0].count", "greater than or equal"),
        ("gpus: [{product: Tesla T4}]\nnvlink: some\n", "nvlink", "'all' or 'none'"),
        ("gpus: [{product: Tesla T4}]\nfaults: [{gpu: 0}]\n", "faults[0]", "exactly one"),
        (
            "gpus: [{product: Tesla T4}]\nfaults: [{gpu: 0, xid: 48, ecc: double}]\n",
            "faults[0]",
            "exactly one of 'xid' (an Xid number), 'ecc' (double or single) or 'lost'",
        ),
        (
            "gpus: [{product: Tesla T4}]\nfaults: [{gpu: 0, ecc: triple}]\n",
            "faults[0].ecc",
            "'double'",
        ),
        ("gpus: [{product: Tesla T4, colour: red}]\n", "gpus[0].colour", "Extra inputs"),
        ("- just a list\n", "", "a mapping with 'gpus'"),
        ("gpus: [\n", "", "not valid YAML"),
    ],
)
def test_mistakes_are_reported_with_their_path(
    tmp_path: Path, text: str, path: str, message: str
) -> None:
    node = tmp_path / "node.yaml"
    node.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_node_file(node)
    problem = caught.value.problems[0]
    assert problem.path == path
    assert message in problem.message
    assert problem.file == str(node)


def test_a_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read node description"):
        load_node_file(tmp_path / "absent.yaml")


def test_reading_faults_tolerates_a_half_written_file(tmp_path: Path) -> None:
    node = tmp_path / "node.yaml"
    node.write_text(
        "gpus: [{product: Tesla T4}]\nfaults:\n  - {gpu: 0, xid: 48}\n  - {gpu: 1, lost: true}\n"
        "  - {gpu: 1, ecc: double}\n"
    )
    assert read_faults(node) == (
        Fault(gpu=0, xid=48),
        Fault(gpu=1, lost=True),
        Fault(gpu=1, ecc="double"),
    )
    node.write_text("gpus: [{product: Tesla T4}]\nfaults:\n  - {gpu: 0, xi")
    assert read_faults(node) is None
    assert read_faults(tmp_path / "absent.yaml") is None


def test_an_escape_past_the_last_unicode_character_is_a_problem_not_a_crash(
    tmp_path: Path,
) -> None:
    node = tmp_path / "node.yaml"
    node.write_text('gpus:\n  - product: "\\U00110000"\nfaults: []\n')
    with pytest.raises(ConfigError, match="an escape names no Unicode character"):
        load_node_file(node)
    assert read_faults(node) is None  # the fault feed keeps what it had


def test_a_preset_is_parsed_once() -> None:
    assert load_preset("t4x4") is load_preset("t4x4")
