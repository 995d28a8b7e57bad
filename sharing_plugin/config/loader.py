"""Reading configs from a file, a ConfigMap manifest or a mounted ConfigMap directory.

One ConfigMap holds several named configs (one per `data` key); a node picks one through its
label, the `--config-name` flag, or the `default` key, as the reference plugin does. Every
problem found is reported at once, each at the line of the file the admin edits: for a manifest
that is the line inside the `data` block, not inside the embedded text.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from sharing_plugin.config.messages import validation_problems
from sharing_plugin.config.model import DEFAULT_IGNORED_XIDS, Config
from sharing_plugin.config.rules import config_warnings
from sharing_plugin.config.yamldoc import Document, Mark, YamlProblem, decode, read
from sharing_plugin.errors import ConfigError, Problem

Remap = Callable[[Mark], Mark]
_START = Mark(0, 0)


@dataclass(frozen=True, slots=True)
class LoadedConfig:
    """A validated config, what is suspicious about it, and a hash of the text it came from."""

    config: Config
    warnings: tuple[str, ...]
    source_hash: str
    file: str


NamedConfigs = dict[str | None, LoadedConfig]
"""Configs by name, in the order written; a plain config file gives the single name None."""


def _problem(file: str, path: str, message: str, mark: Mark | None) -> Problem:
    mark = mark or _START
    return Problem(path, message, file=file, line=mark.line + 1, column=mark.column + 1)


def _hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _without_nulls(value: Any) -> Any:
    """`key:` with nothing after it means "not set", as in the reference's Go decoder."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _config(doc: Document, *, file: str, prefix: str = "", remap: Remap = lambda m: m) -> Config:
    """Validate a composed document as a Config; problems carry `prefix` and remapped marks."""

    def path(inner: str) -> str:
        return f"{prefix}: {inner}" if prefix and inner else (prefix or inner)

    if not isinstance(doc.value, dict):
        raise ConfigError(
            [
                _problem(
                    file,
                    path(""),
                    "a config must be a mapping of sections (version, flags, resources, "
                    f"sharing, ...), not {type(doc.value).__name__}",
                    remap(doc.values.get((), _START)),
                )
            ]
        )
    try:
        return Config.model_validate(_without_nulls(doc.value), by_alias=True, by_name=False)
    except ValidationError as exc:
        raise ConfigError(
            [
                _problem(file, path(where), message, remap(mark))
                for where, message, mark in validation_problems(exc, doc)
            ]
        ) from None


def _read_doc(
    text: str | bytes, *, file: str, prefix: str = "", remap: Remap = lambda m: m
) -> Document:
    try:
        return read(decode(text) if isinstance(text, bytes) else text)
    except YamlProblem as exc:
        raise ConfigError(
            [_problem(file, prefix, exc.message, remap(exc.mark) if exc.mark else remap(_START))]
        ) from None


def _loaded(config: Config, data: bytes, file: str, prefix: str = "") -> LoadedConfig:
    warnings = config_warnings(config)
    if prefix:
        warnings = [f"{prefix}: {w}" for w in warnings]
    return LoadedConfig(config, tuple(warnings), _hash(data), file)


def parse_config(text: str | bytes, *, file: str) -> LoadedConfig:
    """One config from YAML text (a ConfigMap manifest is not accepted here)."""
    data = text if isinstance(text, bytes) else text.encode()
    doc = _read_doc(text, file=file)
    return _loaded(_config(doc, file=file), data, file)


def _is_configmap(value: Any) -> bool:
    return isinstance(value, dict) and value.get("kind") == "ConfigMap"


def block_remap(doc: Document, key: str, text_lines: list[str]) -> Remap:
    """Map a position inside the `data.<key>` string to the manifest the admin edits."""
    node = doc.nodes[("data", key)]
    start = doc.values[("data", key)]
    style = getattr(node, "style", None)
    if style == "|":
        indent = 0
        for line in text_lines[start.line + 1 :]:
            if line.strip():
                indent = len(line) - len(line.lstrip(" "))
                break
        return lambda m: Mark(start.line + 1 + m.line, m.column + indent)
    if style in (None, "'", '"'):
        quote = 0 if style is None else 1
        return lambda m: Mark(start.line, start.column + quote + m.column) if m.line == 0 else start
    return lambda m: start  # folded text: lines do not survive, point at the key's value


def _from_configmap(doc: Document, text: str, *, file: str) -> NamedConfigs:
    data = doc.value.get("data")
    if not isinstance(data, dict) or not data:
        mark = doc.keys.get(("data",), doc.values.get(()))
        raise ConfigError(
            [
                _problem(
                    file, "data", "the ConfigMap has no data: add one key per named config", mark
                )
            ]
        )
    configs: NamedConfigs = {}
    problems: list[Problem] = []
    lines = text.splitlines()
    for key, value in data.items():
        prefix = f"data.{key}"
        if not isinstance(value, str):
            problems.append(
                _problem(
                    file,
                    prefix,
                    "must be a string holding a config (use `|`)",
                    doc.values[("data", key)],
                )
            )
            continue
        remap = block_remap(doc, key, lines)
        try:
            inner = _read_doc(value, file=file, prefix=prefix, remap=remap)
            config = _config(inner, file=file, prefix=prefix, remap=remap)
        except ConfigError as exc:
            problems.extend(exc.problems)
            continue
        configs[key] = _loaded(config, value.encode(), file, prefix)
    if problems:
        raise ConfigError(problems)
    return configs


def parse_configs(text: str | bytes, *, file: str) -> NamedConfigs:
    """A config file (one config, name None) or a ConfigMap manifest (one per data key)."""
    data = text if isinstance(text, bytes) else text.encode()
    try:
        decoded = decode(data)
    except YamlProblem as exc:
        raise ConfigError([_problem(file, "", exc.message, exc.mark)]) from None
    doc = _read_doc(decoded, file=file)
    if _is_configmap(doc.value):
        return _from_configmap(doc, decoded, file=file)
    return {None: _loaded(_config(doc, file=file), data, file)}


def select(
    configs: Mapping[str | None, LoadedConfig],
    label_value: str | None,
    requested_name: str | None,
) -> tuple[str | None, LoadedConfig]:
    """The config this node uses: its label's value, else the requested name, else `default`,
    else the only one. A plain config file (no names) is used whatever the names say.
    """
    if list(configs) == [None]:
        return None, configs[None]
    names = [name for name in configs if name is not None]
    available = ", ".join(names) or "none"
    wanted = label_value or requested_name
    if wanted is None:
        if "default" in configs:
            wanted = "default"
        elif len(names) == 1:
            wanted = names[0]
        else:
            raise ConfigError(
                [
                    Problem(
                        "",
                        "no config selected: label the node, pass --config-name, or add a "
                        f"'default' key (available: {available})",
                    )
                ]
            )
    if wanted not in configs:
        source = "node label" if label_value else "requested"
        raise ConfigError(
            [Problem("", f"unknown config name {wanted!r} ({source}); available: {available}")]
        )
    return wanted, configs[wanted]


def dump_config(config: Config) -> dict[str, Any]:
    """The camelCase v1 form of a config, which the loader reads back to an equal Config."""
    dumped = config.model_dump(mode="json", by_alias=True, exclude_none=True)
    health = dumped["health"]
    critical = set(health.get("criticalXIDs", ()))
    if critical & set(health["ignoredXids"]) and tuple(health["ignoredXids"]) == (
        DEFAULT_IGNORED_XIDS
    ):
        # Accepted only because the ignored list was left at its default: a written list
        # that shares an Xid with criticalXIDs is an error, as in the reference.
        del health["ignoredXids"]
    return dumped
