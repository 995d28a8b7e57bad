"""`sharing-plugin validate` and `schema`: exit codes, output lines, the committed schema."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
from kustomize_render import HAS_KUBECTL, render_text

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
    # No warnings; notes (what NVIDIA's plugin binary would do otherwise) may be said.
    assert all(line.startswith(f"info: {path}: ") for line in err.splitlines())


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


def test_notes_go_to_stderr_after_the_warnings_and_keep_exit_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "flags:\n  gdsEnabled: true\nsharing:\n  timeSlicing:\n    resources:\n"
        "      - name: nvidia.com/gpu\n        rename: gpu.ts\n        replicas: 2\n"
    )
    assert main(["validate", str(path)]) == 0
    out, err = capsys.readouterr()
    assert out == f"{path}: ok\n"
    warning, info = err.splitlines()
    assert warning.startswith(f"warning: {path}: flags.gdsEnabled: ")
    assert info.startswith(f"info: {path}: sharing.timeSlicing.resources[0].rename: ")
    assert "advertises nvidia.com/gpu, not nvidia.com/gpu.ts" in info


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


def test_several_files_in_one_call(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", *map(str, EXAMPLES)]) == 0
    out, _ = capsys.readouterr()
    assert [line.split(": ok", 1)[0] for line in out.splitlines()] == list(map(str, EXAMPLES))


# -- stdin and multi-document streams (issue 15) --------------------------------------------

CONFIGMAP = """\
apiVersion: v1
kind: ConfigMap
metadata:
  name: {name}
data:
  default: |
    version: v1
  shared: |
    sharing:
      timeSlicing:
        resources:
          - name: nvidia.com/gpu
            replicas: 0
"""
SERVICE_ACCOUNT = """\
apiVersion: v1
kind: ServiceAccount
metadata:
  name: sharing-plugin
"""
# Anchors and aliases are fine in other kinds' documents: they are not configs.
DAEMONSET = """\
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: sharing-plugin
  labels: &labels {app: sharing-plugin}
spec:
  selector: {matchLabels: *labels}
"""


def stream(*documents: str) -> str:
    return "---\n".join(documents)


def feed_stdin(monkeypatch: pytest.MonkeyPatch, text: str | bytes) -> None:
    data = text.encode() if isinstance(text, str) else text
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))


def test_dash_reads_stdin_named_stdin_in_lines(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    feed_stdin(monkeypatch, "flags:\n  migStrategy: mixd\n  gdsEnabled: true\n")
    assert main(["validate", "-"]) == 1
    out, _ = capsys.readouterr()
    assert out == (
        "<stdin>:2:16: flags.migStrategy: unknown value 'mixd'; expected 'none', 'single' or "
        "'mixed' (did you mean 'mixed'?)\n"
    )
    feed_stdin(monkeypatch, "flags:\n  gdsEnabled: true\n")
    assert main(["validate", "-"]) == 0
    out, err = capsys.readouterr()
    assert out == "<stdin>: ok\n"
    assert (
        err
        == "warning: <stdin>: flags.gdsEnabled: accepted for compatibility; has no effect here\n"
    )


def test_stdin_with_files_and_only_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("version: v1\n")
    feed_stdin(monkeypatch, CONFIGMAP.format(name="cm").replace("replicas: 0", "replicas: 2"))
    assert main(["validate", str(good), "-"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{good}: ok",
        "<stdin>: ok (2 configs: default, shared)",
    ]
    assert main(["validate", "-", "-"]) == 2
    assert "stdin can be read only once" in capsys.readouterr().err


def test_stream_validates_its_configmap_with_lines_in_the_whole_stream(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    alone = tmp_path / "cm.yaml"
    alone.write_text(CONFIGMAP.format(name="plugin"))
    assert main(["validate", str(alone)]) == 1
    (line_alone,) = capsys.readouterr().out.splitlines()
    assert line_alone == (
        f"{alone}:13:23: data.shared: sharing.timeSlicing.resources[0].replicas: "
        "must be >= 1 (got 0)"
    )
    path = tmp_path / "all.yaml"
    path.write_text(stream(SERVICE_ACCOUNT, DAEMONSET, CONFIGMAP.format(name="plugin")))
    assert main(["validate", str(path)]) == 1
    (line,) = capsys.readouterr().out.splitlines()
    # The ConfigMap starts after 4 + 7 lines and two `---` lines: 13 + 13 = 26.
    assert line == line_alone.replace(f"{alone}:13:", f"{path}:26:")
    assert path.read_text().splitlines()[25] == "            replicas: 0"


def test_stream_with_several_configmaps_names_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "all.yaml"
    path.write_text(
        stream(
            CONFIGMAP.format(name="first"),
            SERVICE_ACCOUNT,
            CONFIGMAP.format(name="second").replace("replicas: 0", "replicas: 2"),
            "version: v2\n",
        )
    )
    assert main(["validate", str(path)]) == 1
    assert capsys.readouterr().out.splitlines() == [
        f"{path}:13:23: configmap/first: data.shared: sharing.timeSlicing.resources[0].replicas: "
        "must be >= 1 (got 0)",
        f"{path}:34:10: document 4: version: unsupported version 'v2'; supported versions: v1",
    ]
    path.write_text(
        stream(
            CONFIGMAP.format(name="first").replace("replicas: 0", "replicas: 2"),
            CONFIGMAP.format(name="second").replace("replicas: 0", "replicas: 3"),
        )
    )
    assert main(["validate", str(path)]) == 0
    assert capsys.readouterr().out == (
        f"{path}: ok (4 configs: configmap/first/default, configmap/first/shared, "
        "configmap/second/default, configmap/second/shared)\n"
    )


def test_stream_without_config_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "rbac.yaml"
    path.write_text(stream(SERVICE_ACCOUNT, DAEMONSET))
    assert main(["validate", str(path)]) == 1
    assert capsys.readouterr().out == (
        f"{path}:1:1: no ConfigMap and no config among the 2 documents of this stream (found "
        "ServiceAccount, DaemonSet); give the plugin's ConfigMap manifest or a config file\n"
    )


def test_yaml_error_in_a_later_document_is_at_its_stream_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "all.yaml"
    path.write_text(stream(SERVICE_ACCOUNT, "kind: DaemonSet\nspec: [unclosed\n", CONFIGMAP))
    assert main(["validate", str(path)]) == 1
    out = capsys.readouterr().out
    assert out == (
        f"{path}:8:1: invalid YAML: while parsing a flow sequence expected ',' or ']', "
        "but got '<document start>'\n"
    )


@pytest.mark.kubectl
@pytest.mark.skipif(not HAS_KUBECTL, reason="kubectl is not installed")
def test_kustomize_output_on_stdin_validates(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rendered = render_text()
    assert rendered.count("\n---\n") >= 2
    feed_stdin(monkeypatch, rendered)
    code = main(["validate", "-"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert out.startswith("<stdin>: ok (")
