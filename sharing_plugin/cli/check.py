"""`validate` and `schema`: what an admin runs before applying a ConfigMap."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sharing_plugin.cli.common import EXIT_INVALID, EXIT_OK, EXIT_USAGE, STDIN
from sharing_plugin.errors import ConfigError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    validate = sub.add_parser("validate", help="validate config files or ConfigMap manifests")
    validate.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="config, ConfigMap manifest, multi-document stream, mounted dir, or - for stdin",
    )
    validate.set_defaults(func=_cmd_validate)
    schema = sub.add_parser("schema", help="print the JSON Schema of the config")
    schema.set_defaults(func=_cmd_schema)


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
        # Notes say what NVIDIA's plugin binary would do differently with this valid config.
        for loaded in configs.values():
            for note in loaded.notes:
                print(f"info: {loaded.file}: {note}", file=sys.stderr)
        names = [key for key in configs if key is not None]
        listed = f" ({len(names)} configs: {', '.join(names)})" if names else ""
        print(f"{name}: ok{listed}")
    return status


def _cmd_schema(args: argparse.Namespace) -> int:
    from sharing_plugin.config.schema import schema_text

    sys.stdout.write(schema_text())
    return EXIT_OK
