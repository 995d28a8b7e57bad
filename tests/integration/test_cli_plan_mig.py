"""`sharing-plugin plan` shows declared MIG layouts: current -> desired, and the actions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sharing_plugin.cli import main
from sharing_plugin.nvml.discover import discover
from sharing_plugin.sim.nvml.simulated import SimulatedNvml

ROOT = Path(__file__).resolve().parents[2]
MIXED = discover(SimulatedNvml.from_preset("a100-mig-mixed"))

LAYOUT = """\
version: v1
flags:
  migStrategy: mixed
partitioning:
  mig:
    - devices: [0]
      profiles:
        3g.40gb: 1
        1g.10gb: 3
    - devices: [3]
      profiles:
        7g.80gb: 1
    - devices: [5]
      enabled: false
"""

IMPOSSIBLE = """\
version: v1
flags:
  migStrategy: mixed
partitioning:
  mig:
    - devices: [4]
      profiles:
        4g.20gb: 1
        2g.10gb: 2
"""


def _plan(config: Path, preset: str, *extra: str) -> int:
    return main(["plan", "--config", str(config), "--gpus", f"simulated:{preset}", *extra])


def test_json_lists_current_desired_and_actions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "layout.yaml"
    config.write_text(LAYOUT)
    assert _plan(config, "a100-mig-mixed", "--format", "json") == 0
    mig = json.loads(capsys.readouterr().out)["mig"]
    assert [(m["index"], m["state"]) for m in mig] == [(0, "change"), (3, "change"), (5, "applied")]
    first = mig[0]
    assert first["gpu"] == MIXED.gpus[0].uuid and first["product"] == "NVIDIA A100-SXM4-80GB"
    assert first["current"] == ["3g.40gb@0", "2g.20gb@4", "1g.10gb@6"]
    assert first["desired"] == ["3g.40gb@0", "1g.10gb@4", "1g.10gb@5", "1g.10gb@6"]
    assert first["actions"] == [
        f"destroy 2g.20gb at slices 4-5 ({MIXED.gpus[0].mig_devices[1].uuid})",
        "create 1g.10gb at slice 4",
        "create 1g.10gb at slice 5",
    ]
    assert mig[1]["actions"] == ["create 7g.80gb at slices 0-7"]
    assert mig[2]["actions"] == [] and mig[2]["error"] is None


def test_table_shows_the_mig_layout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "layout.yaml"
    config.write_text(LAYOUT)
    assert _plan(config, "a100-mig-mixed") == 0
    out = capsys.readouterr().out
    section = out.split("MIG layout:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert section[:4] == [
        "  GPU 0 (NVIDIA A100-SXM4-80GB): 3g.40gb@0 2g.20gb@4 1g.10gb@6 -> "
        "3g.40gb@0 1g.10gb@4 1g.10gb@5 1g.10gb@6",
        f"    destroy 2g.20gb at slices 4-5 ({MIXED.gpus[0].mig_devices[1].uuid})",
        "    create 1g.10gb at slice 4",
        "    create 1g.10gb at slice 5",
    ]
    assert "  GPU 5 (NVIDIA A100-SXM4-40GB): MIG off -> MIG off" in section


def test_impossible_layout_is_rejected_like_validate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "impossible.yaml"
    config.write_text(IMPOSSIBLE)
    assert _plan(config, "a100-mig-mixed") == 1
    (line,) = capsys.readouterr().out.splitlines()
    assert line == (
        f"{config}:7:7: partitioning.mig[0].profiles: GPU 4 ({MIXED.gpus[4].uuid}): "
        "4g.20gb + 2 x 2g.10gb needs 8 slices in an arrangement the A100-40GB does not "
        "allow: 4g.20gb may start only at 0; 2g.10gb may start only at 0, 2 or 4"
    )


def test_layout_naming_a_missing_gpu_is_rejected(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    example = ROOT / "config" / "examples" / "mig-partitioning.yaml"
    assert _plan(example, "dgx-a100-80gb", "--format", "json") == 0
    assert len(json.loads(capsys.readouterr().out)["mig"]) == 8
    assert _plan(example, "a100-mig-mixed") == 1
    lines = capsys.readouterr().out.splitlines()
    assert any("partitioning.mig[2].devices[0]: GPU 6 does not exist" in line for line in lines)
    assert all(line.startswith(f"{example}:") for line in lines)


def test_resources_are_those_the_applied_layout_will_advertise(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "layout.yaml"
    config.write_text(LAYOUT)
    assert _plan(config, "a100-mig-mixed", "--format", "json") == 0
    document = json.loads(capsys.readouterr().out)
    by_name = {r["name"]: r["devices"] for r in document["resources"]}
    # GPU 0 keeps its 3g.40gb and 1g.10gb@6 and gets two new 1g.10gb; GPU 3 becomes a 7g.80gb.
    gpu0 = [d["physical"] for d in by_name["nvidia.com/mig-1g.10gb"]]
    kept = MIXED.gpus[0].mig_devices[2].uuid
    assert kept in gpu0 and "MIG-planned-0-4" in gpu0 and "MIG-planned-0-5" in gpu0
    assert [d["physical"] for d in by_name["nvidia.com/mig-7g.80gb"]] == ["MIG-planned-3-0"]
    assert MIXED.gpus[0].mig_devices[1].uuid not in {
        d["physical"] for devices in by_name.values() for d in devices
    }  # the destroyed 2g.20gb is gone
    assert any(
        "3 device(s) are on MIG instances that do not exist yet" in w for w in document["warnings"]
    )
