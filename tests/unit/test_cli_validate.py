"""`sharing-plugin validate` and `schema`: exit codes, output lines, the committed schema."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sharing_plugin.cli import main
from sharing_plugin.sources.files import load_configs

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "config" / "examples").glob("*.yaml"))
SCHEMA = ROOT / "schemas" / "sharing-config.v1.schema.json"


def test_examples_exist() -> None:
    names = {p.stem for p in EXAMPLES}
    assert {"time-slicing", "per-gpu-replicas", "mig-mixed", "mig-partitioning", "mps"} <= names
    assert "reference-readme" in names


@pytest.mark.parametrize("path", [*EXAMPLES, ROOT / "deploy" / "configmap.yaml"], ids=str)
def test_every_example_validates(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(path)]) == 0
    out, err = capsys.readouterr()
    assert out == f"{path}: ok" + out.split(": ok", 1)[1]
    assert err == ""


def test_deploy_configmap_has_named_configs() -> None:
    configs = load_configs(ROOT / "deploy" / "configmap.yaml")
    assert "default" in configs
    assert len(configs) >= 3


def test_invalid_file_exits_1_with_one_line_per_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("version: v1\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("flags:\n  migStrategy: mixd\n  renameByDefault: true\n")
    assert main(["validate", str(good), str(bad)]) == 1
    out, _ = capsys.readouterr()
    assert out.splitlines() == [
        f"{good}: ok",
        f"{bad}:2:16: flags.migStrategy: unknown value 'mixd'; expected 'none', 'single' or "
        "'mixed' (did you mean 'mixed'?)",
        f"{bad}:3:3: flags.renameByDefault: unknown field 'renameByDefault' here: it belongs "
        "under sharing.mps or sharing.timeSlicing",
    ]


def test_warnings_go_to_stderr_and_keep_exit_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("flags:\n  gdsEnabled: true\n")
    assert main(["validate", str(path)]) == 0
    _, err = capsys.readouterr()
    assert (
        err
        == f"warning: {path}: flags.gdsEnabled: accepted for compatibility; has no effect here\n"
    )


def test_hostile_input_is_one_line_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "evil.yaml"
    path.write_bytes(b"a: &a [1]\nb: *a\n")
    assert main(["validate", str(path)]) == 1
    out, err = capsys.readouterr()
    assert (
        out == f"{path}:2:4: YAML aliases (*a) are not allowed in a config; write the value out\n"
    )
    assert "Traceback" not in err


def test_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate"]) == 2
    assert main(["validate", str(tmp_path / "nope.yaml")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_schema_prints_the_committed_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema"]) == 0
    out, _ = capsys.readouterr()
    assert out == SCHEMA.read_text(), "regenerate: sharing-plugin schema > " + str(SCHEMA)
    schema = json.loads(out)
    sharing = schema["$defs"]["Sharing"]["properties"]
    assert "renameByDefault" in sharing and sharing["renameByDefault"]["description"]


def test_validate_as_a_subprocess() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sharing_plugin", "validate", *map(str, EXAMPLES)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(": ok") == len(EXAMPLES)
