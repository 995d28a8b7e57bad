"""`mps-control`: runs and supervises the MPS control daemons (the DaemonSet's MPS container)."""

from __future__ import annotations

import argparse
import logging
from typing import TYPE_CHECKING

from sharing_plugin.cli.common import (
    DRIVER_FLAG,
    LOG_FLAGS,
    SOURCE_FLAGS,
    Flag,
    add_env_flags,
    driver_name,
    serve_command,
    source_options,
)

if TYPE_CHECKING:
    from sharing_plugin.daemon.mps_control.controller import MpsController, MpsControlOptions

MPS_FLAGS: tuple[Flag, ...] = (
    (
        "--mps-control-bin",
        "MPS_CONTROL_BIN",
        "nvidia-cuda-mps-control",
        "the MPS control binary (a name is looked up on PATH)",
    ),
    (
        "--limits-from",
        "MPS_LIMITS_FROM",
        "config",
        "config (each daemon limits its clients) or claims (run-dra: each claim's CDI edits "
        "limit its client; the daemons set none)",
    ),
    # With claims: run-dra's prepared claims (its checkpoint) hold a daemon as pods do.
    DRIVER_FLAG,
)
# Metrics and health are served by `run`, in the same pod and network namespace.
FLAGS: tuple[Flag, ...] = (*SOURCE_FLAGS, *LOG_FLAGS, *MPS_FLAGS)
"""Every flag of `mps-control`, each with the env var it also reads."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    mps = sub.add_parser(
        "mps-control", help="run and supervise the MPS control daemons (the DaemonSet's MPS side)"
    )
    add_env_flags(mps, FLAGS)
    mps.set_defaults(func=_cmd_mps_control)


def mps_options(args: argparse.Namespace) -> MpsControlOptions:
    from sharing_plugin.daemon.mps_control.controller import MpsControlOptions

    if not args.mps_control_bin:
        raise ValueError("--mps-control-bin must name a binary")
    if args.limits_from not in ("config", "claims"):
        raise ValueError(f"--limits-from must be config or claims (got {args.limits_from!r})")
    return MpsControlOptions(
        source=source_options(args),
        control_bin=args.mps_control_bin,
        limits_from_claims=args.limits_from == "claims",
        driver_name=driver_name(args),
    )


def _controller(options: MpsControlOptions) -> MpsController:
    from sharing_plugin.backends import backend_from_spec
    from sharing_plugin.daemon.mps_control.controller import MpsController
    from sharing_plugin.mps import ControlBinary

    return MpsController(
        options,
        nvml=backend_from_spec(options.source.gpus),
        control=ControlBinary(options.control_bin),
    )


def _cmd_mps_control(args: argparse.Namespace) -> int:
    return serve_command(
        args,
        command="mps-control",
        options=mps_options,
        service=_controller,
        logger=logging.getLogger(__name__),
        stopping="stopping; the MPS daemons keep running",
    )
