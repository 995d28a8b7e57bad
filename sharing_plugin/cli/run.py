"""`run`: the device plugin, the DaemonSet's command."""

from __future__ import annotations

import argparse
import logging
import os
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
from sharing_plugin.config.names import DEFAULT_CONFIG_LABEL
from sharing_plugin.errors import SharingPluginError

if TYPE_CHECKING:
    from sharing_plugin.daemon.app import Daemon
    from sharing_plugin.daemon.options import RunOptions

# Where the config comes from and which GPUs: shared by every command that serves a config.
SOURCE_FLAGS: tuple[Flag, ...] = (
    ("--config", "CONFIG_FILE", None, "config file, or a mounted ConfigMap directory"),
    ("--config-name", "CONFIG_NAME", None, "named config to use when the node has no label"),
    ("--config-map", "CONFIG_MAP", None, "NAMESPACE/NAME: read the ConfigMap through the API"),
    ("--config-label", "CONFIG_LABEL", DEFAULT_CONFIG_LABEL, "node label naming the config"),
    ("--gpus", "GPUS", "nvml", "nvml, simulated:PRESET or simulated:PATH"),
    ("--kubelet-dir", "KUBELET_DIR", "/var/lib/kubelet", "kubelet's state directory"),
    ("--node-name", "NODE_NAME", None, "this node, to follow its config label"),
    ("--metrics-address", "METRICS_ADDRESS", "0.0.0.0:9400", "HOST:PORT for metrics, or off"),
    ("--log-format", "LOG_FORMAT", "text", "text or json"),
    ("--log-level", "LOG_LEVEL", "info", "debug, info, warning or error"),
)
RUN_FLAGS: tuple[Flag, ...] = (
    ("--node-status", "NODE_STATUS", "on", "on or off: events and config state on the Node"),
    ("--clear-labels-on-exit", "CLEAR_LABELS_ON_EXIT", "off", "on or off: remove them at exit"),
    ("--labels-file", "LABELS_FILE", None, "NFD feature file to write GFD-compatible labels to"),
    ("--node-labels", "NODE_LABELS", "off", "on or off: patch those labels onto the Node"),
    ("--proc-root", "PROC_ROOT", "/proc", "the host's /proc, for per-pod GPU usage"),
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = sub.add_parser("run", help="run the device plugin (the DaemonSet's command)")
    add_env_flags(run, (*SOURCE_FLAGS, *RUN_FLAGS))
    run.set_defaults(func=_cmd_run)


def run_options(args: argparse.Namespace) -> RunOptions:
    from sharing_plugin.daemon.health_monitor import HealthEnv
    from sharing_plugin.daemon.logs import parse_log_level
    from sharing_plugin.daemon.options import RunOptions
    from sharing_plugin.observability.http_server import parse_metrics_address

    if args.log_format not in ("text", "json"):
        raise ValueError(f"--log-format must be text or json (got {args.log_format!r})")
    parse_log_level(args.log_level)
    from sharing_plugin.sources.apiconfig import parse_config_map_ref

    config_map = parse_config_map_ref(args.config_map) if args.config_map else None
    return RunOptions(
        config_path=Path(args.config) if args.config else None,
        config_name=args.config_name or None,
        gpus=args.gpus,
        kubelet_dir=Path(args.kubelet_dir),
        node_name=args.node_name or None,
        metrics_address=parse_metrics_address(args.metrics_address),
        config_label=args.config_label,
        config_map=config_map,
        node_status=on_off("--node-status", args.node_status),
        clear_labels_on_exit=on_off("--clear-labels-on-exit", args.clear_labels_on_exit),
        labels_file=Path(args.labels_file) if args.labels_file else None,
        node_labels=on_off("--node-labels", args.node_labels),
        proc_root=Path(args.proc_root),
        health_env=HealthEnv.from_environ(os.environ),
    )


def _daemon(options: RunOptions) -> Daemon:
    from sharing_plugin.backends import backend_from_spec
    from sharing_plugin.daemon.app import Daemon

    return Daemon(options, nvml=backend_from_spec(options.gpus))


def check_socket_paths(kubelet_dir: Path) -> None:
    """Refuse a kubelet dir whose sockets cannot be bound or dialled, instead of retrying forever.

    AF_UNIX paths hold 107 bytes. Our socket names shrink their resource slug to fit, down to
    `sharing-<8 hex>.sock`; that shortest name and kubelet's own two sockets must fit.
    """
    from sharing_plugin.errors import KubeletError
    from sharing_plugin.kubelet.api.constants import (
        DEVICE_PLUGINS_DIR,
        KUBELET_SOCKET,
        POD_RESOURCES_DIR,
    )
    from sharing_plugin.kubelet.server import MAX_SOCKET_PATH_BYTES, socket_name

    ours = socket_name("")  # the shortest: the slug is dropped where the directory is long
    sockets = (
        (kubelet_dir / DEVICE_PLUGINS_DIR / ours, "the plugin's socket at its shortest name"),
        (kubelet_dir / DEVICE_PLUGINS_DIR / KUBELET_SOCKET, "kubelet's registration socket"),
        (kubelet_dir / POD_RESOURCES_DIR / KUBELET_SOCKET, "kubelet's PodResources socket"),
    )
    path, what = max(sockets, key=lambda socket: len(str(socket[0]).encode()))
    size = len(str(path).encode())
    if size > MAX_SOCKET_PATH_BYTES:
        shown = path.with_name("sharing-xxxxxxxx.sock") if path.name == ours else path
        over = size - MAX_SOCKET_PATH_BYTES
        raise KubeletError(
            f"socket path {shown} ({what}) is {size} bytes, over the "
            f"{MAX_SOCKET_PATH_BYTES}-byte limit of a unix socket path: mount the kubelet "
            f"directory at a path at least {over} byte{'s' if over > 1 else ''} shorter and "
            "pass that as --kubelet-dir"
        )


def _cmd_run(args: argparse.Namespace) -> int:
    from sharing_plugin.daemon.logs import configure as configure_logging
    from sharing_plugin.daemon.logs import parse_log_level

    try:
        options = run_options(args)
    except ValueError as exc:
        print(f"sharing-plugin run: {exc}", file=sys.stderr)
        return EXIT_USAGE
    configure_logging(args.log_format, level=parse_log_level(args.log_level))
    try:
        check_socket_paths(options.kubelet_dir)
        serve_until_stopped(
            lambda: _daemon(options), logger=logging.getLogger(__name__), stopping="stopping"
        )
    except SharingPluginError as exc:
        logging.getLogger(__name__).error("cannot run: %s", exc)
        return EXIT_INVALID
    return EXIT_OK
