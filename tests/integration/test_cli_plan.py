"""`sharing-plugin plan` on the simulated presets with every example config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sharing_plugin.cli import main
from sharing_plugin.sim.nvml.node import preset_names

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "config" / "examples").glob("*.yaml"))
# (example, preset) pairs that must not fit: the example names GPUs the node lacks, or MIG
# layouts its GPUs cannot take (mig-partitioning.yaml is written for eight 80GB A100/H100).
MISFITS = {("per-gpu-replicas.yaml", "workstation")} | {
    (example, preset)
    for example in ("mig-partitioning.yaml", "dynamic-mig.yaml")
    for preset in ("a100-mig-mixed", "hgx-h200", "t4x4", "workstation")
}


@pytest.mark.parametrize("preset", preset_names())
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_example_on_every_preset(
    example: Path, preset: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        ["plan", "--config", str(example), "--gpus", f"simulated:{preset}", "--format", "json"]
    )
    out, err = capsys.readouterr()
    if (example.name, preset) in MISFITS:
        assert code == 1
        assert out == ""  # stdout is JSON or nothing; the problem lines are on stderr
        assert err and all(line.startswith(f"{example}:") for line in err.splitlines())
        return
    assert code == 0, out
    doc = json.loads(out)
    assert set(doc) >= {"config", "resources", "mig", "warnings"}
    assert doc["config"] == {"name": None}
    ids = [d["id"] for r in doc["resources"] for d in r["devices"]]
    assert ids and len(ids) == len(set(ids))
    for r in doc["resources"]:
        assert r["sharing"] in ("none", "time-slicing", "mps")
        for d in r["devices"]:
            assert set(d) >= {"id", "physical", "health", "numa"}
            assert d["id"].split("::")[0] == d["physical"]
            assert d["health"] in ("Healthy", "Unhealthy")
    code = main(["plan", "--config", str(example), "--gpus", f"simulated:{preset}"])
    table = capsys.readouterr().out
    assert code == 0
    assert "RESOURCE" in table
    for r in doc["resources"]:
        assert r["name"] in table


def test_table_shows_per_gpu_replicas(capsys: pytest.CaptureFixture[str]) -> None:
    example = ROOT / "config" / "examples" / "time-slicing.yaml"
    assert main(["plan", "--config", str(example), "--gpus", "simulated:t4x4"]) == 0
    out = capsys.readouterr().out
    assert "nvidia.com/gpu.shared" in out and "time-slicing" in out
    rows = [line for line in out.splitlines() if line.strip().startswith("GPU ")]
    assert len(rows) == 4 and all(" 4 " in row for row in rows)


def test_config_that_does_not_fit_points_at_the_entry(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "version: v1\n"
        "sharing:\n"
        "  timeSlicing:\n"
        "    resources:\n"
        "      - name: gpu\n"
        "        devices: [0, 7]\n"
        "        replicas: 2\n"
    )
    assert main(["plan", "--config", str(config), "--gpus", "simulated:t4x4"]) == 1
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith(f"{config}:6:22: sharing.timeSlicing.resources[0].devices[1]: GPU 7")


def test_named_config_in_a_manifest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = tmp_path / "cm.yaml"
    manifest.write_text(
        "apiVersion: v1\n"
        "kind: ConfigMap\n"
        "metadata: {name: plugin}\n"
        "data:\n"
        "  default: |\n"
        "    version: v1\n"
        "  shared: |\n"
        "    version: v1\n"
        "    sharing:\n"
        "      timeSlicing:\n"
        "        resources: [{name: gpu, devices: [9], replicas: 2}]\n"
    )
    args = ["plan", "--config", str(manifest), "--gpus", "simulated:t4x4", "--format", "json"]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["config"] == {"name": "default"}
    assert main([*args, "--config-name", "shared"]) == 1
    (line,) = capsys.readouterr().err.splitlines()  # --format json: problems on stderr
    # At the entry inside the manifest's block, as validate reports config problems.
    assert line.startswith(
        f"{manifest}:11:43: data.shared: sharing.timeSlicing.resources[0].devices[0]: GPU 9"
    )


def test_invalid_config_prints_validate_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("version: v1\nflags:\n  migStrategy: sometimes\n")
    assert main(["plan", "--config", str(config), "--gpus", "simulated:t4x4"]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"{config}:3:") and "flags.migStrategy" in out


def test_unknown_gpu_spec_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    example = ROOT / "config" / "examples" / "time-slicing.yaml"
    assert main(["plan", "--config", str(example), "--gpus", "bogus"]) == 2
    assert "--gpus" in capsys.readouterr().err


def test_missing_config_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.yaml"
    assert main(["plan", "--config", str(missing), "--gpus", "simulated:t4x4"]) == 2
    assert "no such file or directory" in capsys.readouterr().err


# -- plan --format json keeps stdout JSON; located warnings; name suggestions (issue 15) --------


def test_json_on_a_bad_config_writes_nothing_to_stdout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("version: v1\nflags:\n  migStrategy: sometimes\n")
    args = ["plan", "--config", str(config), "--gpus", "simulated:t4x4"]
    assert main(args) == 1
    table_out, table_err = capsys.readouterr()
    assert main([*args, "--format", "json"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    # The same lines as the table format prints (on stdout, as before), now on stderr.
    assert err == table_out + table_err
    assert err.startswith(f"{config}:3:16: flags.migStrategy: unknown value 'sometimes'")


def test_json_on_a_config_that_does_not_fit_writes_nothing_to_stdout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "sharing:\n  timeSlicing:\n    resources: [{name: gpu, devices: [7], replicas: 2}]\n"
    )
    args = ["plan", "--config", str(config), "--gpus", "simulated:t4x4", "--format", "json"]
    assert main(args) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"{config}:3:39: sharing.timeSlicing.resources[0].devices[0]: GPU 7")


def test_json_warnings_carry_file_line_col(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = tmp_path / "cm.yaml"
    manifest.write_text(
        "kind: ConfigMap\n"
        "data:\n"
        "  default: |\n"
        "    flags:\n"
        "      gdsEnabled: true\n"
        "    sharing:\n"
        "      timeSlicing:\n"
        "        resources:\n"
        "          - name: nvidia.com/mig-1g.10gb\n"
        "            replicas: 2\n"
    )
    args = ["plan", "--config", str(manifest), "--gpus", "simulated:t4x4", "--format", "json"]
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["warnings"] == [
        f"{manifest}:5:7: data.default: flags.gdsEnabled: accepted for compatibility; has no "
        "effect here",
        f"{manifest}:9:13: data.default: sharing.timeSlicing.resources[0].name: this node has no "
        "nvidia.com/mig-1g.10gb devices, so this entry shares nothing here",
    ]
    # stderr keeps its warning lines, and the table keeps its words.
    assert err == (
        f"warning: {manifest}: data.default: flags.gdsEnabled: accepted for compatibility; has "
        "no effect here\n"
    )
    assert main(args[:-2]) == 0
    table = capsys.readouterr().out
    assert (
        "  - sharing.timeSlicing.resources[0].name: this node has no nvidia.com/mig-1g.10gb "
        "devices, so this entry shares nothing here"
    ) in table.splitlines()


def test_config_name_near_miss_suggests(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = tmp_path / "cm.yaml"
    manifest.write_text("kind: ConfigMap\ndata:\n  default: ''\n  shared: ''\n")
    args = ["plan", "--config", str(manifest), "--gpus", "simulated:t4x4"]
    assert main([*args, "--config-name", "sahred"]) == 1
    assert capsys.readouterr().out == (
        f"{manifest}: unknown config name 'sahred' (requested; did you mean 'shared'?); "
        "available: default, shared\n"
    )
    assert main([*args, "--config-name", "sahred", "--format", "json"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert "did you mean 'shared'?" in err
    assert main([*args, "--config-name", "zzz"]) == 1
    assert capsys.readouterr().out == (
        f"{manifest}: unknown config name 'zzz' (requested); available: default, shared\n"
    )


def test_plan_of_a_stream_points_into_the_stream(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "all.yaml"
    path.write_text(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: x}\n"
        "---\n"
        "kind: ConfigMap\n"
        "metadata: {name: plugin}\n"
        "data:\n"
        "  default: |\n"
        "    sharing:\n"
        "      timeSlicing:\n"
        "        resources: [{name: gpu, devices: [9], replicas: 2}]\n"
    )
    assert main(["plan", "--config", str(path), "--gpus", "simulated:t4x4"]) == 1
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith(
        f"{path}:11:43: data.default: sharing.timeSlicing.resources[0].devices[0]: GPU 9"
    )


def test_notes_follow_the_warnings_and_are_in_the_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "flags:\n  gdsEnabled: true\nsharing:\n  timeSlicing:\n    resources:\n"
        "      - name: nvidia.com/gpu\n        rename: gpu.ts\n        replicas: 2\n"
    )
    args = ["plan", "--config", str(config), "--gpus", "simulated:t4x4"]
    assert main(args) == 0
    table_err = capsys.readouterr().err
    assert main([*args, "--format", "json"]) == 0
    out, err = capsys.readouterr()
    assert err == table_err
    warning, info = err.splitlines()
    assert warning.startswith(f"warning: {config}: flags.gdsEnabled: ")
    assert info.startswith(f"info: {config}: sharing.timeSlicing.resources[0].rename: honoured")
    (note,) = json.loads(out)["notes"]
    assert note == f"{config}:7:9: " + info.removeprefix(f"info: {config}: ")
