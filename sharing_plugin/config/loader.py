"""Reading configs from a file, a ConfigMap manifest or a mounted ConfigMap directory.

One ConfigMap holds several named configs (one per `data` key); a node picks one through its
label, the `--config-name` flag, or the `default` key, as the reference plugin does. Every
problem found is reported at once, each at the line of the file the admin edits: for a manifest
that is the line inside the `data` block, not inside the embedded text.

A multi-document stream (`kubectl kustomize` output) is read document by document: each
ConfigMap and each config in it is validated, other kinds are skipped, and lines count in the
whole stream. A loaded config keeps where its entries were written (`Origin`), so warnings and
plan problems found later point at the same lines as validation errors.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

import yaml
from pydantic import ValidationError

from sharing_plugin.config import rules
from sharing_plugin.config.advice import config_notes, config_warnings
from sharing_plugin.config.compat import without_nulls
from sharing_plugin.config.locate import Origin, Remap, block_remap, entry_said, joined
from sharing_plugin.config.messages import validation_problems
from sharing_plugin.config.model import DEFAULT_IGNORED_XIDS, Config
from sharing_plugin.config.yamldoc import Document, Mark, YamlProblem, decode, read
from sharing_plugin.errors import ConfigError, Problem

_START = Mark(0, 0)
_DOCUMENT_START = re.compile(r"^---(?=[ \t\r\n]|$)", re.MULTILINE)
_KIND_LINE = re.compile(r"^kind:[ \t]*[\"']?([A-Za-z0-9]+)", re.MULTILINE)


def _same(mark: Mark) -> Mark:
    return mark


@dataclass(frozen=True, slots=True)
class LoadedConfig:
    """A validated config, what is suspicious about it, and a hash of the text it came from.

    `warnings` read `[prefix: ]path: message`; `located_warnings` are the same warnings led by
    the `FILE:LINE:COL:` of the entry they are about. `notes` (and `located_notes`) are written
    the same way and say what this config does here that NVIDIA's plugin binary would not:
    information, not a fault.
    """

    config: Config
    warnings: tuple[str, ...]
    source_hash: str
    file: str
    located_warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    located_notes: tuple[str, ...] = ()
    origin: Origin | None = field(default=None, compare=False, repr=False)

    def locate(self, said: str) -> str:
        """`said` (`path: message` about an entry of this config) at the entry's line, as in
        `located_warnings`; unchanged when it names no config entry."""
        found = entry_said(said)
        if found is None or self.origin is None:
            return said
        return self.origin.line(*found)

    def place(self, problem: Problem) -> Problem:
        """A problem found after loading (the plan's: a config path, no position) at the line
        of the entry it is about, in the text this config was read from -- never the file as
        it is now, which a hot reload may already have changed. Placed problems and problems
        of a default config (no text) are returned as they are."""
        if problem.file is not None or self.origin is None:
            return problem
        return self.origin.place(problem)


NamedConfigs = dict[str | None, LoadedConfig]
"""Configs by name, in the order written; a plain config file gives the single name None."""


def _problem(file: str, path: str, message: str, mark: Mark | None) -> Problem:
    mark = mark or _START
    return Problem(path, message, file=file, line=mark.line + 1, column=mark.column + 1)


def _hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


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
    data = without_nulls(doc.value)
    try:
        config = Config.model_validate(data, by_alias=True, by_name=False)
    except ValidationError as exc:
        found = validation_problems(exc, doc, rules.issues_beside(data, exc))
    else:
        broken = rules.issues(config)
        if not broken:
            return config
        found = validation_problems(None, doc, broken)
    raise ConfigError(
        [_problem(file, path(where), message, remap(mark)) for where, message, mark in found]
    )


def _read_doc(
    text: str | bytes, *, file: str, prefix: str = "", remap: Remap = lambda m: m
) -> Document:
    try:
        return read(decode(text) if isinstance(text, bytes) else text)
    except YamlProblem as exc:
        raise ConfigError(
            [_problem(file, prefix, exc.message, remap(exc.mark) if exc.mark else remap(_START))]
        ) from None


def _said(origin: Origin, said: list[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """`said` (each `path: message`) as `[prefix: ]path: message`, and at the entry's line."""
    located = tuple(origin.line(*(entry_said(s) or ("", s))) for s in said)
    if origin.prefix:
        said = [f"{origin.prefix}: {s}" for s in said]
    return tuple(said), located


def _loaded(config: Config, data: bytes, origin: Origin) -> LoadedConfig:
    warnings, located = _said(origin, config_warnings(config))
    notes, located_notes = _said(origin, config_notes(config))
    return LoadedConfig(
        config,
        warnings,
        _hash(data),
        origin.file,
        located,
        notes=notes,
        located_notes=located_notes,
        origin=origin,
    )


def _plain_origin(doc: Document, file: str, *, prefix: str = "", shift: Remap = _same) -> Origin:
    return Origin(file, prefix, doc.keys, doc.values, shift, fallback=None)


def parse_config(text: str | bytes, *, file: str) -> LoadedConfig:
    """One config from YAML text (a ConfigMap manifest is not accepted here)."""
    data = text if isinstance(text, bytes) else text.encode()
    doc = _read_doc(text, file=file)
    return _loaded(_config(doc, file=file), data, _plain_origin(doc, file))


def _is_configmap(value: Any) -> bool:
    return isinstance(value, dict) and value.get("kind") == "ConfigMap"


def _from_configmap(
    doc: Document, text: str, *, file: str, label: str = "", shift: Remap = _same
) -> NamedConfigs:
    """Every `data` key of a ConfigMap; in a stream, `label` names the document and `shift`
    moves its marks to the stream's lines."""
    data = doc.value.get("data")
    if not isinstance(data, dict) or not data:
        mark = doc.keys.get(("data",), doc.values.get(()))
        raise ConfigError(
            [
                _problem(
                    file,
                    joined(label, "data"),
                    "the ConfigMap has no data: add one key per named config",
                    shift(mark or _START),
                )
            ]
        )
    configs: NamedConfigs = {}
    problems: list[Problem] = []
    lines = text.splitlines()
    for key, value in data.items():
        prefix = joined(label, f"data.{key}")
        if not isinstance(value, str):
            problems.append(
                _problem(
                    file,
                    prefix,
                    "must be a string holding a config (use `|`)",
                    shift(doc.values[("data", key)]),
                )
            )
            continue
        block = block_remap(doc, key, lines)

        def remap(mark: Mark, block: Remap = block) -> Mark:
            return shift(block(mark))

        try:
            inner = _read_doc(value, file=file, prefix=prefix, remap=remap)
            config = _config(inner, file=file, prefix=prefix, remap=remap)
        except ConfigError as exc:
            problems.extend(exc.problems)
            continue
        origin = Origin(
            file, prefix, inner.keys, inner.values, remap, shift(doc.keys[("data", key)])
        )
        configs[f"{label}/{key}" if label else key] = _loaded(config, value.encode(), origin)
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
    starts, complete = _document_starts(decoded)
    if len(starts) > 1:
        return _from_stream(decoded, starts, complete, file=file)
    doc = _read_doc(decoded, file=file)
    if _is_configmap(doc.value):
        return _from_configmap(doc, decoded, file=file)
    return {None: _loaded(_config(doc, file=file), data, _plain_origin(doc, file))}


def _document_starts(text: str) -> tuple[list[tuple[int, int]], bool]:
    """(character index, line) where each document of a YAML stream starts, and whether the
    whole stream was scanned: a syntax error stops the scan, and the document holding it
    reports it when it is read on its own."""
    if not _DOCUMENT_START.search(text):
        return [], True  # a second document needs its `---`: nothing to scan for
    starts: list[tuple[int, int]] = []
    loader: yaml.SafeLoader | None = None
    try:
        loader = yaml.SafeLoader(text)
        while not loader.check_event(yaml.StreamEndEvent):
            event = loader.get_event()  # type: ignore[no-untyped-call]
            if isinstance(event, yaml.DocumentStartEvent) and event.start_mark is not None:
                starts.append((event.start_mark.index, event.start_mark.line))
    except yaml.YAMLError:
        return starts, False
    finally:
        if loader is not None:
            loader.dispose()
    return starts, True


def _kind(doc: Document) -> str | None:
    """The kind of a Kubernetes object document; None for a config (no kind, no apiVersion)."""
    if not isinstance(doc.value, dict) or not {"kind", "apiVersion"} & doc.value.keys():
        return None
    return str(doc.value.get("kind"))


@dataclass(frozen=True, slots=True)
class _Part:
    """One document of a stream: its text, where it starts, and what reading it gave."""

    number: int  # 1-based position in the stream
    text: str
    shift: Remap  # from the document's lines to the stream's
    read: Document | Problem


def _shifter(offset: int) -> Remap:
    # Every document after the first starts at the start of a line (`---` or `%` in column 0).
    return lambda mark: Mark(mark.line + offset, mark.column)


def _from_stream(
    text: str, starts: list[tuple[int, int]], complete: bool, *, file: str
) -> NamedConfigs:
    """Every ConfigMap and config document of a stream; other kinds are skipped. With several,
    each one's names and problems are led by `configmap/<name>` (or `document <n>`)."""
    bounds = [0, *(index for index, _ in starts[1:]), len(text)]
    offsets = [0, *(line for _, line in starts[1:])]
    found: list[_Part] = []
    skipped: list[str] = []
    for number, (begin, end, offset) in enumerate(
        zip(bounds[:-1], bounds[1:], offsets, strict=True), start=1
    ):
        part, shift = text[begin:end], _shifter(offset)
        try:
            doc = read(part)
        except YamlProblem as exc:
            sniffed = _KIND_LINE.search(part)
            # An alias or a tag in another kind's document is not ours to refuse; a syntax error
            # that stopped the scan may hide the documents after it, so it is always reported.
            if sniffed and sniffed.group(1) != "ConfigMap" and (complete or end < len(text)):
                skipped.append(sniffed.group(1))
                continue
            problem = _problem(file, "", exc.message, shift(exc.mark or _START))
            found.append(_Part(number, part, shift, problem))
            continue
        kind = _kind(doc)
        if doc.value is None or not doc.values or kind not in (None, "ConfigMap"):
            skipped += [kind] if kind else []  # an empty document is nothing at all
            continue
        found.append(_Part(number, part, shift, doc))
    if not found:
        kinds = f" (found {', '.join(dict.fromkeys(skipped))})" if skipped else ""
        message = (
            f"no ConfigMap and no config among the {len(offsets)} documents of this stream"
            f"{kinds}; give the plugin's ConfigMap manifest or a config file"
        )
        raise ConfigError([_problem(file, "", message, _START)])
    plain = [f for f in found if isinstance(f.read, Document) and not _kind(f.read)]
    if len(plain) > 1:
        # Several named configs are a ConfigMap's keys; a file of configs has no names for them.
        message = (
            f"a second config in one file (document {plain[1].number}): a config file holds "
            "one config; put named configs in a ConfigMap, one data key each"
        )
        raise ConfigError([_problem(file, "", message, plain[1].shift(_START))])
    labels = _labels(found) if len(found) > 1 else {}
    configs: NamedConfigs = {}
    problems: list[Problem] = []
    for found_part in found:
        label, doc_or_problem = labels.get(found_part.number, ""), found_part.read
        if isinstance(doc_or_problem, Problem):
            problems.append(replace(doc_or_problem, path=label))
            continue
        try:
            configs.update(_from_document(doc_or_problem, found_part, file=file, label=label))
        except ConfigError as exc:
            problems.extend(exc.problems)
    if problems:
        raise ConfigError(problems)
    return configs


def _from_document(doc: Document, part: _Part, *, file: str, label: str) -> NamedConfigs:
    if _kind(doc):
        return _from_configmap(doc, part.text, file=file, label=label, shift=part.shift)
    config = _config(doc, file=file, prefix=label, remap=part.shift)
    origin = _plain_origin(doc, file, prefix=label, shift=part.shift)
    return {label or None: _loaded(config, part.text.encode(), origin)}


def _labels(found: list[_Part]) -> dict[int, str]:
    """`configmap/<name>` for each ConfigMap whose name is unique in the stream, else
    `document <n>` (its position in the stream)."""
    names: dict[int, str] = {}
    for part in found:
        doc = part.read
        meta = doc.value.get("metadata") if isinstance(doc, Document) and _kind(doc) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        if isinstance(name, str) and name:
            names[part.number] = f"configmap/{name}"
    unique = {name for name, count in Counter(names.values()).items() if count == 1}
    return {
        part.number: name
        if (name := names.get(part.number)) in unique
        else f"document {part.number}"
        for part in found
    }


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
