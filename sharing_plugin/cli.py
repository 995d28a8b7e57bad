"""The `sharing-plugin` command line: argument parsing, wiring and exit codes.

Exit codes: 0 success, 1 invalid input (config, node), 2 usage error. Nothing below this module
calls `sys.exit`; errors travel up as exceptions from `sharing_plugin.errors`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from sharing_plugin.config import load_configs, schema_text
from sharing_plugin.errors import ConfigError

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


_COMMANDS = {
    "validate": _cmd_validate,
    "schema": _cmd_schema,
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
