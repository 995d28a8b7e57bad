"""`run-dra`'s flags and env vars (docs/contract.md, "DRA mode"), checked before anything starts."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from sharing_plugin.cli import main
from sharing_plugin.cli.common import DEFAULT_DRIVER
from sharing_plugin.cli.dra import dra_options, register
from sharing_plugin.dra.server import check_socket_paths
from sharing_plugin.errors import KubeletError
from sharing_plugin.views.dra_api import DEFAULT_DRIVER as views_default_driver

DRA_ENV = ("NODE_NAME", "DRIVER_NAME", "CDI_DIR", "CLEAR_SLICES_ON_EXIT", "KUBELET_DIR")


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["run-dra", *argv])


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in DRA_ENV:
        monkeypatch.delenv(name, raising=False)


def test_node_name_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run-dra", "--gpus", "simulated:t4x4"]) == 2
    assert "--node-name (NODE_NAME) is required" in capsys.readouterr().err


@pytest.mark.parametrize("driver", ["GPU.example.com", "-x.io", "a" * 64, "a_b.io", ""])
def test_a_driver_name_that_is_no_dns_subdomain_is_a_usage_error(
    driver: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run-dra", "--node-name", "n", f"--driver-name={driver}"]) == 2
    assert "--driver-name must be a lower-case DNS subdomain" in capsys.readouterr().err


def test_defaults() -> None:
    options = dra_options(parse("--node-name", "n"))
    assert options.driver_name == "gpu.sharing-plugin.io"
    assert options.cdi_dir == Path("/var/run/cdi")
    assert options.clear_slices_on_exit is False
    assert options.source.node_name == "n"
    assert options.source.kubelet_dir == Path("/var/lib/kubelet")


def test_env_vars(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "gpu-7")
    monkeypatch.setenv("DRIVER_NAME", "gpu.example.com")
    monkeypatch.setenv("CDI_DIR", "/etc/cdi")
    monkeypatch.setenv("CLEAR_SLICES_ON_EXIT", "on")
    options = dra_options(parse())
    assert options.source.node_name == "gpu-7"
    assert options.driver_name == "gpu.example.com"
    assert options.cdi_dir == Path("/etc/cdi")
    assert options.clear_slices_on_exit is True


def test_clear_slices_on_exit_takes_on_or_off(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run-dra", "--node-name", "n", "--clear-slices-on-exit", "maybe"]) == 2
    assert "--clear-slices-on-exit must be on or off" in capsys.readouterr().err


def test_socket_paths_must_fit_a_unix_socket_address() -> None:
    check_socket_paths(Path("/var/lib/kubelet"), "gpu.sharing-plugin.io")
    with pytest.raises(KubeletError, match="over the 107-byte limit"):
        check_socket_paths(Path("/" + "k" * 60), "gpu.sharing-plugin.io")


def test_the_cli_default_driver_is_the_views() -> None:
    # The entry keeps its own copy so that building the parser imports no views.
    assert views_default_driver == DEFAULT_DRIVER
