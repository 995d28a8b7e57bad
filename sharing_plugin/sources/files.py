"""Configs on disk (a file, a ConfigMap manifest or a mounted ConfigMap directory) or on stdin.

The config package turns text into configs and finds where a path sits in a text; this module
reads the files those texts come from, so the core never touches the disk. Errors point at the
file the admin edits; problems found later, by the plan, are placed by the loaded config
(`LoadedConfig.place`), from the text it was read from.
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

from sharing_plugin.config.loader import NamedConfigs, parse_config, parse_configs
from sharing_plugin.config.yamldoc import MAX_BYTES
from sharing_plugin.errors import ConfigError, Problem

STDIN_NAME = "<stdin>"
"""What problem lines call standard input (`validate -`)."""


def _whole_file(path: Path | str, message: str) -> Problem:
    return Problem("", message, file=str(path), line=1, column=1)


def _read_bounded(stream: BinaryIO, name: Path | str) -> bytes:
    try:
        data = stream.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ConfigError([_whole_file(name, f"cannot read: {exc.strerror}")]) from None
    if len(data) > MAX_BYTES:
        message = "file is over 1 MiB; a config may be at most 1 MiB"
        raise ConfigError([_whole_file(name, message)])
    return data


def read_config_bytes(path: Path) -> bytes:
    try:
        with path.open("rb") as stream:
            return _read_bounded(stream, path)
    except OSError as exc:
        raise ConfigError([_whole_file(path, f"cannot read: {exc.strerror}")]) from None


def load_stdin(stream: BinaryIO) -> NamedConfigs:
    """Every named config in what `stream` (standard input) holds, named `<stdin>` in problems."""
    return parse_configs(_read_bounded(stream, STDIN_NAME), file=STDIN_NAME)


def load_configs(path: Path) -> NamedConfigs:
    """Every named config at `path`: a config file, a ConfigMap manifest, or a mounted directory.

    A mounted ConfigMap is one file per key behind the `..data` symlink that kubelet swaps
    atomically; names starting with '.' are kubelet's bookkeeping and are skipped.
    """
    if not path.is_dir():
        return parse_configs(read_config_bytes(path), file=str(path))
    configs: NamedConfigs = {}
    problems: list[Problem] = []
    dangling: list[str] = []
    try:
        entries = sorted(path.iterdir())
    except OSError as exc:  # removed or unlistable between the check and the listing
        raise ConfigError(
            [Problem(path="", message=f"cannot list the directory: {exc.strerror}", file=str(path))]
        ) from exc
    for entry in entries:
        if entry.name.startswith(".") or not entry.is_file():
            # A key removed from the ConfigMap dangles for a moment during kubelet's swap, so
            # a dangling link is skipped; it is only named when nothing else is there.
            if not entry.name.startswith(".") and entry.is_symlink() and not entry.exists():
                dangling.append(entry.name)
            continue
        try:
            configs[entry.name] = parse_config(read_config_bytes(entry), file=str(entry))
        except ConfigError as exc:
            problems.extend(exc.problems)
    if problems:
        raise ConfigError(problems)
    if not configs:
        message = "the directory holds no config (one file per name)"
        if dangling:
            message += (
                f"; {', '.join(dangling)} link to files that do not exist (a mounted ConfigMap "
                "whose ..data points at a removed directory?)"
            )
        raise ConfigError([_whole_file(path, message)])
    return configs
