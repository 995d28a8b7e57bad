"""`mps-control`'s flags: the config sources of `run`, the control binary, usage errors."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from sharing_plugin.cli import EXIT_USAGE, main
from sharing_plugin.cli.mps import mps_options, register


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["mps-control", *argv])


def test_flags_become_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MPS_CONTROL_BIN", raising=False)
    args = parse(["--config", "/etc/c.yaml", "--kubelet-dir", "/k", "--gpus", "simulated:t4x4"])
    options = mps_options(args)
    assert options.control_bin == "nvidia-cuda-mps-control"
    assert options.source.config_path == Path("/etc/c.yaml")
    assert options.source.kubelet_dir == Path("/k")
    assert options.source.gpus == "simulated:t4x4"


def test_the_binary_comes_from_the_env_or_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MPS_CONTROL_BIN", "/opt/mps/control")
    assert mps_options(parse([])).control_bin == "/opt/mps/control"
    flag = parse(["--mps-control-bin", "/x"])
    assert mps_options(flag).control_bin == "/x"


def test_limits_come_from_the_config_unless_told_from_claims(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("MPS_LIMITS_FROM", raising=False)
    assert mps_options(parse([])).limits_from_claims is False
    assert mps_options(parse(["--limits-from", "claims"])).limits_from_claims is True
    monkeypatch.setenv("MPS_LIMITS_FROM", "claims")
    assert mps_options(parse([])).limits_from_claims is True
    assert main(["mps-control", "--limits-from", "pods"]) == EXIT_USAGE
    assert "--limits-from must be config or claims (got 'pods')" in capsys.readouterr().err


def test_no_metrics_flag_the_plugin_serves_them() -> None:
    with pytest.raises(SystemExit):
        parse(["--metrics-address", "off"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--log-format", "xml"], "--log-format must be text or json"),
        (["--mps-control-bin", ""], "--mps-control-bin must name a binary"),
    ],
)
def test_usage_errors_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["mps-control", *argv]) == EXIT_USAGE
    assert message in capsys.readouterr().err
