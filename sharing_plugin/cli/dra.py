"""`run-dra`: the same config served as a DRA kubelet plugin (docs/contract.md, "DRA mode")."""

from __future__ import annotations

import argparse
import logging
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sharing_plugin.cli.common import (
    EXIT_INVALID,
    EXIT_OK,
    EXIT_USAGE,
    Flag,
    add_env_flags,
    on_off,
    serve_until_stopped,
)
from sharing_plugin.cli.run import SOURCE_FLAGS, run_options
from sharing_plugin.errors import SharingPluginError

if TYPE_CHECKING:
    from sharing_plugin.daemon.dra import DraDaemon, DraOptions

DEFAULT_DRIVER = "gpu.sharing-plugin.io"  # plan.dra.DEFAULT_DRIVER, without importing the plan
DRA_FLAGS: tuple[Flag, ...] = (
    ("--driver-name", "DRIVER_NAME", DEFAULT_DRIVER, "DRA driver name (a DNS subdomain)"),
    (
        "--cdi-dir",
        "CDI_DIR",
        "/var/run/cdi",
        "directory the container runtime reads CDI specs from",
    ),
    (
        "--clear-slices-on-exit",
        "CLEAR_SLICES_ON_EXIT",
        "off",
        "on or off: delete the node's ResourceSlices at exit",
    ),
)
# ResourceSlice.spec.driver: a DNS subdomain of at most 63 characters.
_DRIVER = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dra = sub.add_parser("run-dra", help="run as a DRA kubelet plugin (Kubernetes 1.32+)")
    add_env_flags(dra, (*SOURCE_FLAGS, *DRA_FLAGS))
    # `run`'s node status and label features are not part of run-dra.
    dra.set_defaults(
        func=_cmd_run_dra,
        node_status="off",
        clear_labels_on_exit="off",
        labels_file=None,
        node_labels="off",
        proc_root="/proc",
    )


def dra_options(args: argparse.Namespace) -> DraOptions:
    from sharing_plugin.daemon.dra import DraOptions

    if not args.node_name:
        raise ValueError("--node-name (NODE_NAME) is required: the node's pool is published")
    driver = args.driver_name
    if len(driver) > 63 or not _DRIVER.fullmatch(driver):
        raise ValueError(
            f"--driver-name must be a lower-case DNS subdomain of at most 63 characters "
            f"(got {driver!r})"
        )
    if not args.cdi_dir:
        raise ValueError("--cdi-dir must name a directory")
    return DraOptions(
        run=run_options(args),
        driver_name=driver,
        cdi_dir=Path(args.cdi_dir),
        clear_slices_on_exit=on_off("--clear-slices-on-exit", args.clear_slices_on_exit),
    )


def _daemon(options: DraOptions) -> DraDaemon:
    from sharing_plugin.backends import backend_from_spec
    from sharing_plugin.daemon.dra import DraDaemon

    return DraDaemon(options, nvml=backend_from_spec(options.run.gpus))


def _cmd_run_dra(args: argparse.Namespace) -> int:
    from sharing_plugin.daemon.logs import configure as configure_logging
    from sharing_plugin.daemon.logs import parse_log_level

    try:
        options = dra_options(args)
    except ValueError as exc:
        print(f"sharing-plugin run-dra: {exc}", file=sys.stderr)
        return EXIT_USAGE
    configure_logging(args.log_format, level=parse_log_level(args.log_level))
    try:
        from sharing_plugin.dra.server import check_socket_paths

        check_socket_paths(options.run.kubelet_dir, options.driver_name)
        serve_until_stopped(
            lambda: _daemon(options), logger=logging.getLogger(__name__), stopping="stopping"
        )
    except SharingPluginError as exc:
        logging.getLogger(__name__).error("cannot run: %s", exc)
        return EXIT_INVALID
    return EXIT_OK
