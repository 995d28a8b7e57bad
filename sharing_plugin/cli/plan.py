"""`plan`: what a config would advertise on a node, or on every node of a cluster, without kubelet.

`--gpus SPEC` plans one node (a table, the JSON document, or the node's labels); `--nodes FILE`
plans every node `kubectl get nodes -o json` printed, each with the config its label selects.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from sharing_plugin.cli.common import (
    DEFAULT_DRIVER,
    EXIT_INVALID,
    EXIT_OK,
    EXIT_USAGE,
    STDIN,
    add_env_flags,
)
from sharing_plugin.errors import ConfigError, PlanError, SharingPluginError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from sharing_plugin.config.loader import LoadedConfig, NamedConfigs

# A placeholder no real node is likely to be called, yet a name the API server accepts, so that
# the printed pool applies unchanged; NODE_NAME (as the DaemonSet sets it) gives the real one.
DEFAULT_NODE_NAME = "example-node"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    plan = sub.add_parser(
        "plan", help="show what a config would advertise on a node or on every node of a cluster"
    )
    plan.add_argument(
        "--config", required=True, metavar="PATH", help="config file, manifest or dir"
    )
    plan.add_argument("--config-name", metavar="NAME", help="which named config to use")
    node = plan.add_mutually_exclusive_group(required=True)
    node.add_argument("--gpus", metavar="SPEC", help="nvml, simulated:PRESET or simulated:PATH")
    node.add_argument(
        "--nodes",
        metavar="NODES.json",
        help="the output of `kubectl get nodes -o json` (- for stdin): plan every node",
    )
    plan.add_argument(
        "--format",
        choices=("table", "json", "labels", "dra"),
        default="table",
        help="labels: the node's GFD-compatible labels, sorted key=value lines; dra: the "
        "DeviceClasses and ResourceSlices run-dra publishes, as YAML (both --gpus only)",
    )
    add_env_flags(
        plan,
        [
            (
                "--node-name",
                "NODE_NAME",
                DEFAULT_NODE_NAME,
                "the node's name in --format dra: its pool and nodeName (a DNS subdomain)",
            )
        ],
    )
    plan.add_argument(
        "--driver-name",
        default=DEFAULT_DRIVER,
        metavar="NAME",
        help="the DRA driver's name in --format dra",
    )
    plan.set_defaults(func=_cmd_plan)


def _print_said(configs: Sequence[LoadedConfig]) -> None:
    """Warnings, then notes (what NVIDIA's plugin binary would do otherwise), on stderr."""
    for loaded in configs:
        for warning in loaded.warnings:
            print(f"warning: {loaded.file}: {warning}", file=sys.stderr)
    for loaded in configs:
        for note in loaded.notes:
            print(f"info: {loaded.file}: {note}", file=sys.stderr)


def _load(args: argparse.Namespace, problems_to: TextIO) -> NamedConfigs | int:
    """The configs at --config, or the exit code after saying why not."""
    from sharing_plugin.sources.files import load_configs

    if not Path(args.config).exists():  # as validate: a path that is not there is a usage error
        print(f"sharing-plugin plan: {args.config}: no such file or directory", file=sys.stderr)
        return EXIT_USAGE
    try:
        return load_configs(Path(args.config))
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem if problem.file else f"{args.config}: {problem}", file=problems_to)
        return EXIT_INVALID


def _cmd_plan(args: argparse.Namespace) -> int:
    if args.nodes is not None:
        return _plan_fleet(args)
    return _plan_node(args)


def _plan_node(args: argparse.Namespace) -> int:
    from sharing_plugin.backends import backend_from_spec, names_node_file
    from sharing_plugin.views.dra_api import is_dns_subdomain

    if args.format == "dra" and not is_dns_subdomain(args.node_name):
        print(
            "sharing-plugin plan: --node-name (NODE_NAME) must be a node's name, a lower-case "
            "DNS subdomain of at most 253 characters: letters, digits, '-' and '.', each part "
            f"starting and ending with a letter or digit (got {args.node_name!r})",
            file=sys.stderr,
        )
        return EXIT_USAGE
    from sharing_plugin.cli.render import plan_json, plan_table
    from sharing_plugin.config.selection import select
    from sharing_plugin.nvml.discover import discover
    from sharing_plugin.plan.node import plan_node
    from sharing_plugin.views.labels import labels, render_labels

    # With --format json or labels, stdout is that output or nothing: problem lines go to stderr.
    problems_to = sys.stdout if args.format == "table" else sys.stderr
    configs = _load(args, problems_to)
    if isinstance(configs, int):
        return configs
    try:
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
    from sharing_plugin.config.options import DRIVER_ROOT_ENV, with_driver_root

    config = loaded.config
    if (
        flags := with_driver_root(config.flags, os.environ.get(DRIVER_ROOT_ENV))
    ) is not config.flags:
        config = config.model_copy(update={"flags": flags})
    try:
        inventory = discover(backend, fail_on_init_error=config.flags.fail_on_init_error)
    except SharingPluginError as exc:
        print(f"sharing-plugin plan: {args.gpus}: {exc}", file=sys.stderr)
        return EXIT_INVALID
    try:
        # Nothing is held here: the command sees the node, not its pods.
        facts = None
        if config.memory_limits.on:
            from sharing_plugin.backends import cgroup_version
            from sharing_plugin.config.memory import HOOK_PATH_ENV, hook_path
            from sharing_plugin.sources.host import node_facts

            hook = hook_path(config.memory_limits, os.environ.get(HOOK_PATH_ENV))
            facts = node_facts(cgroup_version=cgroup_version(args.gpus, backend), hook_path=hook)
        node = plan_node(config, inventory, facts=facts)
    except PlanError as exc:
        for problem in exc.problems:
            print(loaded.place(problem), file=problems_to)
        return EXIT_INVALID
    _print_said([loaded])
    if node.problems:
        for problem in node.problems:
            print(loaded.place(problem), file=problems_to)
        return EXIT_INVALID
    result, warnings = node.plan, list(node.warnings)
    if args.format in ("labels", "dra"):
        # The node as its declared MIG layouts will leave it, as the JSON's resources are.
        for warning in warnings:
            print(f"warning: {loaded.locate(warning)}", file=sys.stderr)
        if args.format == "labels":
            sys.stdout.write(render_labels(labels(config, node)))
        else:
            import yaml

            from sharing_plugin.views.dra import dra_documents

            documents = dra_documents(config, node, args.node_name, args.driver_name)
            sys.stdout.write(yaml.safe_dump_all(documents, sort_keys=False))
    elif args.format == "json":
        layouts = [action.to_json() for action in node.actions]
        # Every warning about a config entry carries its FILE:LINE:COL:, as problems do.
        located = [*loaded.located_warnings, *map(loaded.locate, warnings)]
        document = plan_json(
            result, config_name=name, mig=layouts, warnings=located, locate=loaded.locate
        )
        document["notes"] = list(loaded.located_notes)
        print(json.dumps(document, indent=2))
    else:
        lines = [line for action in node.actions for line in action.lines()]
        print(plan_table(result, config_name=name, mig=lines, warnings=warnings))
    return EXIT_OK


def _read_nodes(name: str) -> Any:
    """The parsed nodes document; raises OSError, or ValueError when it is not JSON."""
    data = sys.stdin.buffer.read() if name == STDIN else Path(name).read_bytes()
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _plan_fleet(args: argparse.Namespace) -> int:
    from sharing_plugin.cli.render import fleet_json, fleet_table
    from sharing_plugin.fleet.view import NodesDocumentError, fleet_view

    if args.format in ("labels", "dra"):
        print(
            f"sharing-plugin plan: --format {args.format} is about one node: give --gpus, "
            "not --nodes",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if args.nodes != STDIN and not Path(args.nodes).exists():
        print(f"sharing-plugin plan: {args.nodes}: no such file or directory", file=sys.stderr)
        return EXIT_USAGE
    configs = _load(args, sys.stdout if args.format == "table" else sys.stderr)
    if isinstance(configs, int):
        return configs
    try:
        document = _read_nodes(args.nodes)
    except OSError as exc:
        print(f"sharing-plugin plan: {args.nodes}: cannot read: {exc.strerror}", file=sys.stderr)
        return EXIT_INVALID
    except ValueError as exc:
        print(f"sharing-plugin plan: {args.nodes}: not JSON: {exc}", file=sys.stderr)
        return EXIT_INVALID
    try:
        view = fleet_view(document, configs, requested_name=args.config_name)
    except NodesDocumentError as exc:
        print(f"sharing-plugin plan: {args.nodes}: {exc}", file=sys.stderr)
        return EXIT_INVALID
    _print_said(list(configs.values()))
    if args.format == "json":
        print(json.dumps(fleet_json(view), indent=2))
    else:
        print(fleet_table(view))
    return EXIT_INVALID if view.has_errors else EXIT_OK
