"""`run-dra`: the same config served as a DRA kubelet plugin (docs/contract.md, "DRA mode")."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from sharing_plugin.cli.common import (
    CDI_DIR_FLAG,
    DRIVER_FLAG,
    LOG_FLAGS,
    METRICS_FLAGS,
    SOURCE_FLAGS,
    Flag,
    add_env_flags,
    driver_name,
    on_off,
    serve_command,
    source_options,
)

if TYPE_CHECKING:
    from sharing_plugin.daemon.run_dra.driver import DraDriver, DraOptions

DRA_FLAGS: tuple[Flag, ...] = (
    DRIVER_FLAG,
    CDI_DIR_FLAG,
    (
        "--clear-slices-on-exit",
        "CLEAR_SLICES_ON_EXIT",
        "off",
        "on or off: delete the node's ResourceSlices at exit",
    ),
)
FLAGS: tuple[Flag, ...] = (*SOURCE_FLAGS, *METRICS_FLAGS, *LOG_FLAGS, *DRA_FLAGS)
"""Every flag of `run-dra`, each with the env var it also reads."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dra = sub.add_parser("run-dra", help="run as a DRA kubelet plugin (Kubernetes 1.32+)")
    add_env_flags(dra, FLAGS)
    dra.set_defaults(func=_cmd_run_dra)


def dra_options(args: argparse.Namespace) -> DraOptions:
    from sharing_plugin.daemon.node.health_monitor import HealthEnv
    from sharing_plugin.daemon.run_dra.driver import DraOptions
    from sharing_plugin.observability.http_server import parse_metrics_address

    if not args.node_name:
        raise ValueError("--node-name (NODE_NAME) is required: the node's pool is published")
    driver = driver_name(args)
    if not args.cdi_dir:
        raise ValueError("--cdi-dir must name a directory")
    return DraOptions(
        source=source_options(args),
        metrics_address=parse_metrics_address(args.metrics_address),
        health_env=HealthEnv.from_environ(os.environ),
        driver_name=driver,
        cdi_dir=Path(args.cdi_dir),
        clear_slices_on_exit=on_off("--clear-slices-on-exit", args.clear_slices_on_exit),
    )


def _daemon(options: DraOptions) -> DraDriver:
    from dataclasses import replace

    from sharing_plugin.backends import serving_backend
    from sharing_plugin.daemon.run_dra.driver import DraDriver

    nvml, source = serving_backend(options.source)
    return DraDriver(replace(options, source=source), nvml=nvml)


def _check(options: DraOptions) -> None:
    from sharing_plugin.dra.server import check_socket_paths

    check_socket_paths(options.source.kubelet_dir, options.driver_name)


def _cmd_run_dra(args: argparse.Namespace) -> int:
    return serve_command(
        args,
        command="run-dra",
        options=dra_options,
        service=_daemon,
        check=_check,
        logger=logging.getLogger(__name__),
    )
