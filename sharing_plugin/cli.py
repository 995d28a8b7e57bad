"""The `sharing-plugin` command line: argument parsing, wiring and exit codes.

Exit codes: 0 success, 1 invalid input (config, node), 2 usage error. Nothing below this module
calls `sys.exit`; errors travel up as exceptions from `sharing_plugin.errors`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from sharing_plugin.config import load_configs, schema_text, select
from sharing_plugin.errors import ConfigError, PlanError, Problem, SharingPluginError
from sharing_plugin.gpus.nvml import backend_from_spec, discover
from sharing_plugin.mig.desired import mig_actions
from sharing_plugin.plan import plan
from sharing_plugin.plan.render import locate, plan_json, plan_table

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_USAGE = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sharing-plugin",
        description="Kubernetes device plugin for NVIDIA GPUs: time-slicing, MIG and MPS.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    validate = sub.add_parser("validate", help="validate config files or ConfigMap manifests")
    validate.add_argument("files", nargs="+", metavar="FILE")

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
    return parser


def _cmd_validate(args: argparse.Namespace) -> int:
    missing = [name for name in args.files if not Path(name).exists()]
    for name in missing:
        print(f"sharing-plugin validate: {name}: no such file or directory", file=sys.stderr)
    if missing:
        return EXIT_USAGE
    status = EXIT_OK
    for name in args.files:
        try:
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
    sys.stdout.write(schema_text())
    return EXIT_OK


def _plan_problem_line(problem: Problem, file: str, config_name: str | None) -> str:
    """A plan problem as `validate` prints config problems: at the entry it is about."""
    if problem.file is not None:
        return str(problem)
    path = Path(file)
    manifest = path.is_file() and config_name is not None
    if path.is_dir() and config_name is not None:
        path = path / config_name
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        text = ""
    # Inside a ConfigMap manifest, point at the config's key and name it, as validate does.
    prefix = f"data.{config_name}: " if manifest else ""
    target = f"data.{config_name}" if manifest else problem.path
    where = locate(target, text) if target else None
    at = f"{path}:{where[0]}:{where[1]}: " if where else f"{path}: "
    inner = f"{problem.path}: " if problem.path else ""
    return f"{at}{prefix}{inner}{problem.message}"


def _cmd_plan(args: argparse.Namespace) -> int:
    try:
        configs = load_configs(Path(args.config))
        name, loaded = select(configs, None, args.config_name)
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem if problem.file else f"{args.config}: {problem}")
        return EXIT_INVALID
    try:
        backend = backend_from_spec(args.gpus)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"sharing-plugin plan: {problem}", file=sys.stderr)
        return EXIT_USAGE
    config = loaded.config
    try:
        inventory = discover(backend, fail_on_init_error=config.flags.fail_on_init_error)
        # Nothing is held here: the command sees the node, not its pods.
        mig = mig_actions(config, inventory)
        result = plan(config, inventory)
    except PlanError as exc:
        for problem in (*mig.problems, *exc.problems):
            print(_plan_problem_line(problem, args.config, name))
        return EXIT_INVALID
    except SharingPluginError as exc:
        print(f"sharing-plugin plan: {args.gpus}: {exc}", file=sys.stderr)
        return EXIT_INVALID
    for warning in loaded.warnings:
        print(f"warning: {loaded.file}: {warning}", file=sys.stderr)
    if mig.problems:
        for problem in mig.problems:
            print(_plan_problem_line(problem, args.config, name))
        return EXIT_INVALID
    warnings = list(inventory.warnings)
    if args.format == "json":
        layouts = [action.to_json() for action in mig.actions]
        document = plan_json(result, config_name=name, mig=layouts, warnings=warnings)
        print(json.dumps(document, indent=2))
    else:
        lines = [line for action in mig.actions for line in action.lines()]
        print(plan_table(result, config_name=name, mig=lines, warnings=warnings))
    return EXIT_OK


_COMMANDS = {
    "validate": _cmd_validate,
    "schema": _cmd_schema,
    "plan": _cmd_plan,
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
