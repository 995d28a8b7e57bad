"""What every command shares: exit codes, on/off flags, and flags that also read env vars."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_USAGE = 2
STDIN = "-"

Flag = tuple[str, str, str | None, str]
"""(flag, env var, default, help): a flag that also reads an env var, as the DaemonSet sets it."""


def add_env_flags(parser: argparse.ArgumentParser, flags: Sequence[Flag]) -> None:
    for flag, env, default, text in flags:
        parser.add_argument(
            flag,
            default=os.environ.get(env, default),
            metavar=flag.removeprefix("--").upper().replace("-", "_"),
            help=f"{text} (env {env}{'' if default is None else f'; default {default}'})",
        )


def on_off(flag: str, value: str) -> bool:
    word = value.strip().lower()
    if word in ("on", "true", "1", "yes"):
        return True
    if word in ("off", "false", "0", "no"):
        return False
    raise ValueError(f"{flag} must be on or off (got {value!r})")
