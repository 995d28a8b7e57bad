"""The `sharing-plugin` command line: argument parsing, wiring and exit codes.

Exit codes: 0 success, 1 invalid input (config, node), 2 usage error. Nothing below this package
calls `sys.exit`; errors travel up as exceptions from `sharing_plugin.errors`. One module per
command (or family of commands), each registering its parser; each imports what only it needs
when it runs, so `validate` never loads grpc, NVML or the simulators, and `run` starts sooner.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from sharing_plugin.cli import check, demo, dra, mps, plan, run, top
from sharing_plugin.cli.common import EXIT_INVALID, EXIT_OK, EXIT_USAGE

__all__ = ["EXIT_INVALID", "EXIT_OK", "EXIT_USAGE", "kubectl_main", "main"]


class _VersionAction(argparse.Action):
    """`--version`: the installed version, looked up only when asked (the lookup reads package
    metadata, which every other command would pay for at start)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="show the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        from sharing_plugin import installed_version

        print(f"{parser.prog} {installed_version()}")
        parser.exit()


_COMMANDS = (check, plan, run, dra, mps, demo, top)
# The module that registers each command: a command line naming one builds only its parser
# (every command's flags cost ~1.5 % of `run`'s start; issue 29). Any other first word (an
# option, `--help`, a typo) gets the whole parser, and its listing or its error.
_REGISTERED_BY = {
    "validate": check,
    "schema": check,
    "plan": plan,
    "run": run,
    "run-dra": dra,
    "mps-control": mps,
    "demo": demo,
    "top": top,
}


def _parser(
    prog: str = "sharing-plugin", argv: Sequence[str] | None = None
) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Kubernetes device plugin for NVIDIA GPUs: time-slicing, MIG and MPS.",
    )
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    named = _REGISTERED_BY.get(argv[0]) if argv else None
    for command in (named,) if named is not None else _COMMANDS:
        command.register(sub)
    return parser


def kubectl_main(argv: Sequence[str] | None = None) -> int:
    """`kubectl-sharing`: the same commands as a kubectl plugin (`kubectl sharing top
    --cluster`): kubectl runs `kubectl-sharing` from PATH with the words after `sharing`."""
    return main(argv, prog="kubectl sharing")


def main(argv: Sequence[str] | None = None, *, prog: str = "sharing-plugin") -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = _parser(prog, argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on usage errors, 0 on --help
        return int(exc.code or 0)
    status: int = args.func(args)
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
