"""`plan`: what a config would advertise on a node, without kubelet."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sharing_plugin.cli.common import EXIT_INVALID, EXIT_OK, EXIT_USAGE
from sharing_plugin.errors import ConfigError, PlanError, SharingPluginError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    plan = sub.add_parser("plan", help="show what a config would advertise on a node")
    plan.add_argument(
        "--config", required=True, metavar="PATH", help="config file, manifest or dir"
    )
    plan.add_argument("--config-name", metavar="NAME", help="which named config to use")
    plan.add_argument(
        "--gpus", required=True, metavar="SPEC", help="nvml, simulated:PRESET or simulated:PATH"
    )
    plan.add_argument("--format", choices=("table", "json"), default="table")
    plan.set_defaults(func=_cmd_plan)


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
