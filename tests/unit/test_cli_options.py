"""Command-line conventions: `--version`, `run --log-level`, and the socket path limit of
`run --kubelet-dir`, checked before anything starts."""

from __future__ import annotations

import argparse
import logging
from importlib.metadata import version
from pathlib import Path

import pytest

import sharing_plugin
from sharing_plugin.cli import _REGISTERED_BY, _parser, main
from sharing_plugin.cli.run import check_socket_paths as _check_socket_paths
from sharing_plugin.daemon.node.logs import parse_log_level
from sharing_plugin.errors import KubeletError


def test_version_prints_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    installed = version("gpu-sharing-plugin")
    assert capsys.readouterr().out == f"sharing-plugin {installed}\n"
    assert sharing_plugin.__version__ == installed


def test_version_of_a_tree_never_installed_is_unknown() -> None:
    assert sharing_plugin.installed_version("no-such-distribution-here") == "0+unknown"


@pytest.mark.parametrize(
    ("text", "level"),
    [("debug", logging.DEBUG), ("info", logging.INFO), ("WARNING", logging.WARNING),
     ("error", logging.ERROR)],
)  # fmt: skip
def test_log_levels(text: str, level: int) -> None:
    assert parse_log_level(text) == level


def test_invalid_log_level_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "--log-level", "loud"]) == 2
    assert capsys.readouterr().err == (
        "sharing-plugin run: --log-level must be debug, info, warning or error (got 'loud')\n"
    )
    monkeypatch.setenv("LOG_LEVEL", "trace")
    assert main(["run"]) == 2
    assert "(got 'trace')" in capsys.readouterr().err


def test_socket_paths_up_to_the_limit_pass() -> None:
    # 70 bytes + "/device-plugins/sharing-xxxxxxxx.sock" (37) = 107, the AF_UNIX limit.
    _check_socket_paths(Path("/" + "k" * 69))
    _check_socket_paths(Path("/var/lib/kubelet"))
    _check_socket_paths(Path("/var/snap/microk8s/common/var/lib/kubelet"))


def test_socket_path_over_the_limit_names_path_and_limit() -> None:
    kubelet_dir = Path("/" + "k" * 70)
    with pytest.raises(KubeletError) as raised:
        _check_socket_paths(kubelet_dir)
    assert str(raised.value) == (
        f"socket path {kubelet_dir}/device-plugins/sharing-xxxxxxxx.sock (the plugin's socket "
        "at its shortest name) is 108 bytes, over the 107-byte limit of a unix socket path: "
        "mount the kubelet directory at a path at least 1 byte shorter and pass that as "
        "--kubelet-dir"
    )


def test_proc_root_comes_from_the_flag_or_proc_root(monkeypatch: pytest.MonkeyPatch) -> None:
    from pathlib import Path

    from sharing_plugin.cli import _parser
    from sharing_plugin.cli.run import run_options

    assert run_options(_parser().parse_args(["run"])).proc_root == Path("/proc")
    monkeypatch.setenv("PROC_ROOT", "/host/proc")
    assert run_options(_parser().parse_args(["run"])).proc_root == Path("/host/proc")
    flagged = _parser().parse_args(["run", "--proc-root", "/mnt/proc"])
    assert run_options(flagged).proc_root == Path("/mnt/proc")


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return {
        name: sub
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for name, sub in action.choices.items()
    }


def test_a_command_line_naming_a_command_builds_that_command_alone() -> None:
    everything = _commands(_parser())
    # Every command is known by name, so none falls back to the whole parser unnoticed.
    assert set(_REGISTERED_BY) == set(everything)
    for name, whole in everything.items():
        alone = _commands(_parser(argv=[name]))
        assert name in alone
        assert alone[name].format_help() == whole.format_help()
    assert len(_commands(_parser(argv=["run"]))) == 1
    # An option or an unknown word first: the whole parser, for its listing or its error.
    assert _commands(_parser(argv=["--help"])).keys() == everything.keys()
    assert _commands(_parser(argv=["rnu"])).keys() == everything.keys()


def test_an_unknown_command_is_refused_with_the_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rnu"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'rnu'" in err and "'run'" in err and "'validate'" in err
