"""`run`: the device plugin, the DaemonSet's command."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from sharing_plugin.cli.common import (
    CDI_DIR_FLAG,
    LOG_FLAGS,
    METRICS_FLAGS,
    SOURCE_FLAGS,
    Flag,
    add_env_flags,
    on_off,
    serve_command,
    source_options,
)

if TYPE_CHECKING:
    from sharing_plugin.daemon.run.app import NodeDevicePlugin
    from sharing_plugin.daemon.run.options import RunOptions

RUN_FLAGS: tuple[Flag, ...] = (
    ("--node-status", "NODE_STATUS", "on", "on or off: events and config state on the Node"),
    ("--clear-labels-on-exit", "CLEAR_LABELS_ON_EXIT", "off", "on or off: remove them at exit"),
    ("--labels-file", "LABELS_FILE", None, "NFD feature file to write GFD-compatible labels to"),
    ("--node-labels", "NODE_LABELS", "off", "on or off: patch those labels onto the Node"),
    ("--proc-root", "PROC_ROOT", "/proc", "the host's /proc, for per-pod GPU usage"),
    CDI_DIR_FLAG,
)
FLAGS: tuple[Flag, ...] = (*SOURCE_FLAGS, *METRICS_FLAGS, *LOG_FLAGS, *RUN_FLAGS)
"""Every flag of `run`, each with the env var it also reads."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = sub.add_parser("run", help="run the device plugin (the DaemonSet's command)")
    add_env_flags(run, FLAGS)
    run.set_defaults(func=_cmd_run)


def run_options(args: argparse.Namespace) -> RunOptions:
    from sharing_plugin.daemon.node.health_monitor import HealthEnv
    from sharing_plugin.daemon.node.options import NodeReportOptions
    from sharing_plugin.daemon.run.options import RunOptions
    from sharing_plugin.observability.http_server import parse_metrics_address

    return RunOptions(
        source=source_options(args),
        report=NodeReportOptions(
            node_status=on_off("--node-status", args.node_status),
            clear_labels_on_exit=on_off("--clear-labels-on-exit", args.clear_labels_on_exit),
            labels_file=Path(args.labels_file) if args.labels_file else None,
            node_labels=on_off("--node-labels", args.node_labels),
            pod_namespace=os.environ.get("POD_NAMESPACE") or None,
            pod_name=os.environ.get("POD_NAME") or None,
            pod_uid=os.environ.get("POD_UID") or None,
        ),
        metrics_address=parse_metrics_address(args.metrics_address),
        proc_root=Path(args.proc_root),
        cdi_dir=_cdi_dir(args.cdi_dir),
        health_env=HealthEnv.from_environ(os.environ),
    )


def _cdi_dir(value: str) -> Path:
    if not value:
        raise ValueError("--cdi-dir must name a directory")
    return Path(value)


def _daemon(options: RunOptions) -> NodeDevicePlugin:
    from dataclasses import replace

    from sharing_plugin.backends import serving_backend
    from sharing_plugin.daemon.run.app import NodeDevicePlugin

    nvml, source = serving_backend(options.source)
    return NodeDevicePlugin(replace(options, source=source), nvml=nvml)


def check_socket_paths(kubelet_dir: Path) -> None:
    """Refuse a kubelet dir whose sockets cannot be bound or dialled, instead of retrying forever.

    AF_UNIX paths hold 107 bytes. Our socket names shrink their resource slug to fit, down to
    `sharing-<8 hex>.sock`; that shortest name and kubelet's own two sockets must fit.
    """
    from sharing_plugin.kit.unix_grpc import (
        MAX_SOCKET_PATH_BYTES,
        check_socket_path,
        socket_path_bytes,
    )
    from sharing_plugin.kubelet.api.constants import (
        DEVICE_PLUGINS_DIR,
        KUBELET_SOCKET,
        POD_RESOURCES_DIR,
    )
    from sharing_plugin.kubelet.server import socket_name

    ours = socket_name("")  # the shortest: the slug is dropped where the directory is long
    sockets = (
        (kubelet_dir / DEVICE_PLUGINS_DIR / ours, "the plugin's socket at its shortest name"),
        (kubelet_dir / DEVICE_PLUGINS_DIR / KUBELET_SOCKET, "kubelet's registration socket"),
        (kubelet_dir / POD_RESOURCES_DIR / KUBELET_SOCKET, "kubelet's PodResources socket"),
    )
    path, what = max(sockets, key=lambda socket: socket_path_bytes(socket[0]))
    over = socket_path_bytes(path) - MAX_SOCKET_PATH_BYTES
    check_socket_path(
        path,
        what=what,
        shown=path.with_name("sharing-xxxxxxxx.sock") if path.name == ours else path,
        advice=f"mount the kubelet directory at a path at least {over} "
        f"byte{'s' if over > 1 else ''} shorter and pass that as --kubelet-dir",
    )


def _cmd_run(args: argparse.Namespace) -> int:
    return serve_command(
        args,
        command="run",
        options=run_options,
        service=_daemon,
        check=lambda options: check_socket_paths(options.source.kubelet_dir),
        logger=logging.getLogger(__name__),
    )
