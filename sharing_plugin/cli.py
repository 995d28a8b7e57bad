"""The `sharing-plugin` command line: argument parsing, wiring and exit codes.

Exit codes: 0 success, 1 invalid input (config, node), 2 usage error. Nothing below this module
calls `sys.exit`; errors travel up as exceptions from `sharing_plugin.errors`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from sharing_plugin.config.names import DEFAULT_CONFIG_LABEL
from sharing_plugin.errors import ConfigError, PlanError, SharingPluginError

if TYPE_CHECKING:
    from sharing_plugin.daemon.options import RunOptions

# Each command imports what only it needs when it runs: `validate` never loads grpc, NVML or
# the simulators, and `run` starts sooner.

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_USAGE = 2


STDIN = "-"


def _parser() -> argparse.ArgumentParser:
    from sharing_plugin import __version__

    parser = argparse.ArgumentParser(
        prog="sharing-plugin",
        description="Kubernetes device plugin for NVIDIA GPUs: time-slicing, MIG and MPS.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    validate = sub.add_parser("validate", help="validate config files or ConfigMap manifests")
    validate.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="config, ConfigMap manifest, multi-document stream, mounted dir, or - for stdin",
    )

    sub.add_parser("schema", help="print the JSON Schema of the config")

    plan = sub.add_parser("plan", help="show what a config would advertise on a node")
    plan.add_argument(
        "--config", required=True, metavar="PATH", help="config file, manifest or dir"
    )
    plan.add_argument("--config-name", metavar="NAME", help="which named config to use")
    plan.add_argument(
        "--gpus", required=True, metavar="SPEC", help="nvml, simulated:PRESET or simulated:PATH"
    )
    plan.add_argument("--format", choices=("table", "json"), default="table")

    run = sub.add_parser("run", help="run the device plugin (the DaemonSet's command)")
    for flag, env, default, text in _RUN_FLAGS:
        run.add_argument(
            flag,
            default=os.environ.get(env, default),
            metavar=flag.removeprefix("--").upper().replace("-", "_"),
            help=f"{text} (env {env}{'' if default is None else f'; default {default}'})",
        )

    demo = sub.add_parser("demo", help="the plugin on a simulated node with a simulated kubelet")
    demo.add_argument("--once", action="store_true", help="print, admit one pod, and exit")
    return parser


# flag, env var, default, help: every `run` flag also reads an env var (DESIGN §3).
_RUN_FLAGS: tuple[tuple[str, str, str | None, str], ...] = (
    ("--config", "CONFIG_FILE", None, "config file, or a mounted ConfigMap directory"),
    ("--config-name", "CONFIG_NAME", None, "named config to use when the node has no label"),
    ("--gpus", "GPUS", "nvml", "nvml, simulated:PRESET or simulated:PATH"),
    ("--kubelet-dir", "KUBELET_DIR", "/var/lib/kubelet", "kubelet's state directory"),
    ("--node-name", "NODE_NAME", None, "this node, to follow its config label"),
    ("--metrics-address", "METRICS_ADDRESS", "0.0.0.0:9400", "HOST:PORT for metrics, or off"),
    ("--log-format", "LOG_FORMAT", "text", "text or json"),
    ("--log-level", "LOG_LEVEL", "info", "debug, info, warning or error"),
    ("--config-label", "CONFIG_LABEL", DEFAULT_CONFIG_LABEL, "node label naming the config"),
    ("--config-map", "CONFIG_MAP", None, "NAMESPACE/NAME: read the ConfigMap through the API"),
    ("--node-status", "NODE_STATUS", "on", "on or off: events and config state on the Node"),
    ("--clear-labels-on-exit", "CLEAR_LABELS_ON_EXIT", "off", "on or off: remove them at exit"),
    ("--labels-file", "LABELS_FILE", None, "NFD feature file to write GFD-compatible labels to"),
    ("--node-labels", "NODE_LABELS", "off", "on or off: patch those labels onto the Node"),
)


def _on_off(flag: str, value: str) -> bool:
    word = value.strip().lower()
    if word in ("on", "true", "1", "yes"):
        return True
    if word in ("off", "false", "0", "no"):
        return False
    raise ValueError(f"{flag} must be on or off (got {value!r})")


def _cmd_validate(args: argparse.Namespace) -> int:
    from sharing_plugin.sources.files import STDIN_NAME, load_configs, load_stdin

    missing = [name for name in args.files if name != STDIN and not Path(name).exists()]
    for name in missing:
        print(f"sharing-plugin validate: {name}: no such file or directory", file=sys.stderr)
    if args.files.count(STDIN) > 1:
        print("sharing-plugin validate: -: stdin can be read only once", file=sys.stderr)
        return EXIT_USAGE
    if missing:
        return EXIT_USAGE
    status = EXIT_OK
    for name in args.files:
        try:
            if name == STDIN:
                name = STDIN_NAME
                configs = load_stdin(sys.stdin.buffer)
            else:
                configs = load_configs(Path(name))
        except ConfigError as exc:
            for problem in exc.problems:
                print(problem)
            status = EXIT_INVALID
            continue
        for loaded in configs.values():
            for warning in loaded.warnings:
                print(f"warning: {loaded.file}: {warning}", file=sys.stderr)
        names = [key for key in configs if key is not None]
        listed = f" ({len(names)} configs: {', '.join(names)})" if names else ""
        print(f"{name}: ok{listed}")
    return status


def _cmd_schema(args: argparse.Namespace) -> int:
    from sharing_plugin.config import schema_text

    sys.stdout.write(schema_text())
    return EXIT_OK


def _cmd_plan(args: argparse.Namespace) -> int:
    from sharing_plugin.backends import backend_from_spec, names_node_file
    from sharing_plugin.config import select
    from sharing_plugin.nvml.discover import discover
    from sharing_plugin.plan.node import plan_node
    from sharing_plugin.plan.render import plan_json, plan_table
    from sharing_plugin.sources.files import load_configs, problem_line

    if not Path(args.config).exists():  # as validate: a path that is not there is a usage error
        print(f"sharing-plugin plan: {args.config}: no such file or directory", file=sys.stderr)
        return EXIT_USAGE
    # With --format json, stdout is the JSON document or nothing: problem lines go to stderr.
    problems_to = sys.stderr if args.format == "json" else sys.stdout
    try:
        configs = load_configs(Path(args.config))
        name, loaded = select(configs, None, args.config_name)
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem if problem.file else f"{args.config}: {problem}", file=problems_to)
        return EXIT_INVALID
    try:
        backend = backend_from_spec(args.gpus)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"sharing-plugin plan: {problem}", file=sys.stderr)
        # A node description that exists but is wrong is invalid input, as `run` treats it; a
        # SPEC that names no backend, preset or file is a usage error.
        return EXIT_INVALID if names_node_file(args.gpus) else EXIT_USAGE
    config = loaded.config
    try:
        inventory = discover(backend, fail_on_init_error=config.flags.fail_on_init_error)
    except SharingPluginError as exc:
        print(f"sharing-plugin plan: {args.gpus}: {exc}", file=sys.stderr)
        return EXIT_INVALID
    try:
        # Nothing is held here: the command sees the node, not its pods.
        node = plan_node(config, inventory)
    except PlanError as exc:
        for problem in exc.problems:
            print(problem_line(problem, file=args.config, config_name=name), file=problems_to)
        return EXIT_INVALID
    for warning in loaded.warnings:
        print(f"warning: {loaded.file}: {warning}", file=sys.stderr)
    if node.problems:
        for problem in node.problems:
            print(problem_line(problem, file=args.config, config_name=name), file=problems_to)
        return EXIT_INVALID
    result, warnings = node.plan, list(node.warnings)
    if args.format == "json":
        layouts = [action.to_json() for action in node.actions]
        # Every warning about a config entry carries its FILE:LINE:COL:, as problems do.
        located = [*loaded.located_warnings, *map(loaded.locate, warnings)]
        document = plan_json(
            result, config_name=name, mig=layouts, warnings=located, locate=loaded.locate
        )
        print(json.dumps(document, indent=2))
    else:
        lines = [line for action in node.actions for line in action.lines()]
        print(plan_table(result, config_name=name, mig=lines, warnings=warnings))
    return EXIT_OK


def _run_options(args: argparse.Namespace) -> RunOptions:
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
        node_status=_on_off("--node-status", args.node_status),
        clear_labels_on_exit=_on_off("--clear-labels-on-exit", args.clear_labels_on_exit),
        labels_file=Path(args.labels_file) if args.labels_file else None,
        node_labels=_on_off("--node-labels", args.node_labels),
        health_env=HealthEnv.from_environ(os.environ),
    )


async def _serve(options: RunOptions) -> None:
    from sharing_plugin.backends import backend_from_spec
    from sharing_plugin.daemon.app import Daemon

    loop = asyncio.get_running_loop()
    daemon = Daemon(options, nvml=backend_from_spec(options.gpus))
    # Handlers first: a signal that arrives while the daemon is still starting must stop it
    # gracefully too (it is acted on as soon as start-up has finished).
    loop.add_signal_handler(signal.SIGTERM, daemon.request_stop)
    loop.add_signal_handler(signal.SIGINT, daemon.request_stop)
    loop.add_signal_handler(signal.SIGHUP, daemon.request_reload)
    try:
        async with daemon:
            await daemon.wait_stopped()
            logging.getLogger(__name__).info("stopping")
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)


def _check_socket_paths(kubelet_dir: Path) -> None:
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
        options = _run_options(args)
    except ValueError as exc:
        print(f"sharing-plugin run: {exc}", file=sys.stderr)
        return EXIT_USAGE
    configure_logging(args.log_format, level=parse_log_level(args.log_level))
    try:
        _check_socket_paths(options.kubelet_dir)
        asyncio.run(_serve(options))
    except SharingPluginError as exc:
        logging.getLogger(__name__).error("cannot run: %s", exc)
        return EXIT_INVALID
    return EXIT_OK


def _cmd_demo(args: argparse.Namespace) -> int:
    from sharing_plugin.daemon.logs import configure as configure_logging
    from sharing_plugin.sim.demo import run_demo

    configure_logging("text", level=logging.WARNING)
    # The simulated kubelet warns, as kubelet does, when our stream ends at shutdown: expected.
    logging.getLogger("sharing_plugin.sim.kubelet.endpoint").setLevel(logging.ERROR)
    # The demo prints rejected configs itself.
    logging.getLogger("sharing_plugin.daemon.app").setLevel(logging.CRITICAL)

    async def demo() -> int:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        loop.add_signal_handler(signal.SIGINT, task.cancel)
        loop.add_signal_handler(signal.SIGTERM, task.cancel)
        return await run_demo(once=args.once, say=lambda line: print(line, flush=True))

    try:
        return asyncio.run(demo())
    except asyncio.CancelledError:
        print("stopped.")
        return EXIT_OK


_COMMANDS = {
    "validate": _cmd_validate,
    "schema": _cmd_schema,
    "plan": _cmd_plan,
    "run": _cmd_run,
    "demo": _cmd_demo,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on usage errors, 0 on --help
        return int(exc.code or 0)
    return _COMMANDS[args.command](args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
