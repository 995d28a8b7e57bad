"""`mps-control`: runs and supervises the MPS control daemons (the DaemonSet's MPS container)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sharing_plugin.cli.common import (
    EXIT_INVALID,
    EXIT_OK,
    EXIT_USAGE,
    Flag,
    add_env_flags,
    serve_until_stopped,
)
from sharing_plugin.cli.run import SOURCE_FLAGS
from sharing_plugin.errors import SharingPluginError

if TYPE_CHECKING:
    from sharing_plugin.daemon.mps import MpsController, MpsControlOptions

# Metrics and health are served by `run`, in the same pod and network namespace.
_SOURCE_FLAGS = tuple(f for f in SOURCE_FLAGS if f[0] != "--metrics-address")
MPS_FLAGS: tuple[Flag, ...] = (
    (
        "--mps-control-bin",
        "MPS_CONTROL_BIN",
        "nvidia-cuda-mps-control",
        "the MPS control binary (a name is looked up on PATH)",
    ),
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    mps = sub.add_parser(
        "mps-control", help="run and supervise the MPS control daemons (the DaemonSet's MPS side)"
    )
    add_env_flags(mps, (*_SOURCE_FLAGS, *MPS_FLAGS))
    mps.set_defaults(func=_cmd_mps_control)


def mps_options(args: argparse.Namespace) -> MpsControlOptions:
    from sharing_plugin.daemon.logs import parse_log_level

    if args.log_format not in ("text", "json"):
        raise ValueError(f"--log-format must be text or json (got {args.log_format!r})")
    parse_log_level(args.log_level)
    if not args.mps_control_bin:
        raise ValueError("--mps-control-bin must name a binary")
    from sharing_plugin.daemon.mps import MpsControlOptions
    from sharing_plugin.daemon.options import RunOptions
    from sharing_plugin.sources.apiconfig import parse_config_map_ref

    return MpsControlOptions(
        source=RunOptions(
            config_path=Path(args.config) if args.config else None,
            config_name=args.config_name or None,
            config_map=parse_config_map_ref(args.config_map) if args.config_map else None,
            gpus=args.gpus,
            kubelet_dir=Path(args.kubelet_dir),
            node_name=args.node_name or None,
            config_label=args.config_label,
        ),
        control_bin=args.mps_control_bin,
    )


def _controller(options: MpsControlOptions) -> MpsController:
    from sharing_plugin.backends import backend_from_spec
    from sharing_plugin.daemon.mps import MpsController
    from sharing_plugin.mps import ControlBinary

    return MpsController(
        options,
        nvml=backend_from_spec(options.source.gpus),
        control=ControlBinary(options.control_bin),
    )


def _cmd_mps_control(args: argparse.Namespace) -> int:
    from sharing_plugin.daemon.logs import configure as configure_logging
    from sharing_plugin.daemon.logs import parse_log_level

    try:
        options = mps_options(args)
    except ValueError as exc:
        print(f"sharing-plugin mps-control: {exc}", file=sys.stderr)
        return EXIT_USAGE
    configure_logging(args.log_format, level=parse_log_level(args.log_level))
    try:
        serve_until_stopped(
            lambda: _controller(options),
            logger=logging.getLogger(__name__),
            stopping="stopping; the MPS daemons keep running",
        )
    except SharingPluginError as exc:
        logging.getLogger(__name__).error("cannot run: %s", exc)
        return EXIT_INVALID
    return EXIT_OK
