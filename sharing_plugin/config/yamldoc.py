"""Safe YAML reading that remembers where every key and value came from.

We compose the node graph ourselves instead of calling `yaml.safe_load`, because errors must
point at file:line:col and the loaded dict has no positions. Composing also lets us refuse what a
config never needs and an attacker loves: aliases (the "billion laughs" expansion), tags that
construct objects, duplicate keys (YAML says they are an error; PyYAML silently keeps the last),
and absurd nesting. Only the plain JSON-like types come out.

Where PyYAML has libyaml, its C parser turns the text into events, about nine times faster than
the pure-Python scanner, and the node graph is still composed here in Python (so aliases and
nesting are refused exactly as before; libyaml's own composer recurses in C with no depth
limit). The pure-Python parser stays the reference: text with a character it refuses or with
one of the few constructs the two read differently (see `_REFERENCE_ONLY`), and text libyaml
finds anything wrong with, are read by it, so what is accepted and every error message and
position are its own, whatever libyaml would have said.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.reader import Reader
from yaml.resolver import Resolver

MAX_BYTES = 1024 * 1024  # a ConfigMap cannot hold more than 1 MiB either
MAX_DEPTH = 64
# Text the fast path leaves to the reference: characters the reference refuses, and what the
# two parsers were found to read differently (tests/unit/test_config_yamldoc.py looks for more):
# tabs (libyaml takes them as separators where the reference refuses them), a bare "!" tag,
# empty values in flow mappings and after "?" (other positions), "#" right after a block
# scalar's header (libyaml takes it as a comment). "{}", the empty mapping a dumper writes, has
# no value to be empty and is read alike. The refused characters are found with the reference's
# own compiled pattern: compiling its character class again into this one cost ~2% of `run`'s
# start (issue 29).
_REFERENCE_ONLY = re.compile("[\t!?]|{(?!})|[|>][-+0-9]*#")
_LONG_ESCAPE = re.compile(r"\\U([0-9A-Fa-f]{8})")

Path = tuple[str | int, ...]

_TAG = "tag:yaml.org,2002:"
_SCALARS = {
    f"{_TAG}str": SafeConstructor.construct_yaml_str,
    f"{_TAG}int": SafeConstructor.construct_yaml_int,
    f"{_TAG}float": SafeConstructor.construct_yaml_float,
    f"{_TAG}bool": SafeConstructor.construct_yaml_bool,
    f"{_TAG}null": SafeConstructor.construct_yaml_null,
}


@dataclass(frozen=True, slots=True)
class Mark:
    """A 0-based position in the text."""

    line: int
    column: int


class YamlProblem(Exception):
    """Text that is not an acceptable YAML config document; `mark` is where, when known."""

    def __init__(self, message: str, mark: Mark | None = None) -> None:
        self.message = message
        self.mark = mark
        super().__init__(message)


@dataclass(slots=True)
class Document:
    """The plain value of a document, with the mark of every value and every mapping key."""

    value: Any
    values: dict[Path, Mark] = field(default_factory=dict)
    keys: dict[Path, Mark] = field(default_factory=dict)
    nodes: dict[Path, Node] = field(default_factory=dict)


def _mark(node_or_event: Any) -> Mark:
    return Mark(node_or_event.start_mark.line, node_or_event.start_mark.column)


class _RefuseAliases(Composer):
    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        if self.check_event(AliasEvent):  # type: ignore[attr-defined]
            event = self.peek_event()  # type: ignore[attr-defined]
            raise YamlProblem(
                f"YAML aliases (*{event.anchor}) are not allowed in a config; write the value out",
                _mark(event),
            )
        return super().compose_node(parent, index)


class _NoAliasLoader(_RefuseAliases, yaml.SafeLoader):
    """The pure-Python reader: the reference for what is accepted and what errors say."""


_FastLoader: Any = None
if yaml.__with_libyaml__:
    from yaml._yaml import CParser

    class _FastLoader(_RefuseAliases, CParser, SafeConstructor, Resolver):  # type: ignore[no-redef]
        """libyaml's events, composed by the same Python composer as the reference."""

        def __init__(self, text: str) -> None:
            CParser.__init__(self, text)
            Composer.__init__(self)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)


def _compose(text: str) -> Node | None:
    reference_only = _REFERENCE_ONLY.search(text) or Reader.NON_PRINTABLE.search(text)
    if _FastLoader is not None and not reference_only:
        loader = None
        try:
            loader = _FastLoader(text)
            return loader.get_single_node()  # type: ignore[no-any-return]
        except (yaml.YAMLError, YamlProblem, RecursionError, ValueError, OverflowError):
            pass  # the reference reads it again and says what is wrong in its own words
        finally:
            if loader is not None:
                loader.dispose()
    slow = _NoAliasLoader(text)
    try:
        return slow.get_single_node()
    finally:
        slow.dispose()


def decode(data: bytes) -> str:
    """UTF-8 text of a config, or a problem at the first byte that is not UTF-8."""
    if len(data) > MAX_BYTES:
        raise YamlProblem(
            f"file is {len(data) / MAX_BYTES:.1f} MiB; a config may be at most 1 MiB "
            "(the size limit of a ConfigMap)"
        )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        before = data[: exc.start]
        line = before.count(b"\n")
        column = len(before) - (before.rfind(b"\n") + 1)
        raise YamlProblem(
            f"not UTF-8 (byte 0x{data[exc.start]:02x}); save the file as UTF-8",
            Mark(line, column),
        ) from None


def read(text: str) -> Document:
    """Compose one YAML document into plain values with marks; an empty document is `{}`."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        raise YamlProblem("text is over 1 MiB; a config may be at most 1 MiB")
    # The reference loader checks the whole text for unprintable characters as it is built,
    # so building it is inside the `try` too.
    try:
        root = _compose(text)
    except yaml.reader.ReaderError as exc:
        raise YamlProblem(
            f"character U+{exc.character:04X} is not allowed in YAML; delete it or write it "
            'escaped inside double quotes ("\\x.." or "\\u....")',
            _position_mark(text, exc.position),
        ) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        message = " ".join(p for p in (exc.context, exc.problem) if p) or "invalid YAML"
        raise YamlProblem(
            f"invalid YAML: {message}", Mark(mark.line, mark.column) if mark else None
        ) from None
    except yaml.YAMLError as exc:
        raise YamlProblem(f"invalid YAML: {exc}") from None
    except RecursionError:
        raise YamlProblem(f"nesting deeper than {MAX_DEPTH} levels") from None
    except (ValueError, OverflowError):
        # PyYAML's scanner lets chr() fail on a "\U" escape past U+10FFFF instead of saying so.
        raise _escape_problem(text) from None
    doc = Document(value={})
    if root is not None:
        doc.value = _build(root, (), doc, 0)
    return doc


def _escape_problem(text: str) -> YamlProblem:
    for match in _LONG_ESCAPE.finditer(text):
        if int(match.group(1), 16) > sys.maxunicode:
            return YamlProblem(
                f"invalid YAML: escape \\U{match.group(1)} is past U+10FFFF, the last Unicode "
                "character",
                _position_mark(text, match.start()),
            )
    return YamlProblem("invalid YAML: an escape names no Unicode character")


def _position_mark(text: str, position: int) -> Mark:
    before = text[:position]
    return Mark(before.count("\n"), position - (before.rfind("\n") + 1))


def _build(node: Node, path: Path, doc: Document, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise YamlProblem(f"nesting deeper than {MAX_DEPTH} levels", _mark(node))
    doc.values[path] = _mark(node)
    doc.nodes[path] = node
    if isinstance(node, ScalarNode):
        construct = _SCALARS.get(node.tag)
        if construct is None:
            if node.tag == f"{_TAG}timestamp":
                return node.value  # dates mean nothing here; keep the text as written
            raise YamlProblem(f"tag {_short(node.tag)} is not allowed in a config", _mark(node))
        try:
            value = construct(SafeConstructor(), node)
        except (ValueError, yaml.YAMLError) as exc:
            raise YamlProblem(f"bad {_short(node.tag)} value: {exc}", _mark(node)) from None
        return _text(value, node) if isinstance(value, str) else value
    if isinstance(node, SequenceNode):
        if node.tag != f"{_TAG}seq":
            raise YamlProblem(f"tag {_short(node.tag)} is not allowed in a config", _mark(node))
        return [_build(item, (*path, i), doc, depth + 1) for i, item in enumerate(node.value)]
    if isinstance(node, MappingNode):
        if node.tag != f"{_TAG}map":
            raise YamlProblem(f"tag {_short(node.tag)} is not allowed in a config", _mark(node))
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == f"{_TAG}merge":
                raise YamlProblem("merge keys (<<) are not allowed in a config", _mark(key_node))
            if not isinstance(key_node, ScalarNode) or key_node.tag != f"{_TAG}str":
                raise YamlProblem("keys must be plain strings", _mark(key_node))
            key = _text(key_node.value, key_node)
            if key in out:
                first = doc.keys[(*path, key)]
                raise YamlProblem(
                    f"duplicate key {key!r} (first at line {first.line + 1}); "
                    "keep one, YAML does not merge them",
                    _mark(key_node),
                )
            doc.keys[(*path, key)] = _mark(key_node)
            out[key] = _build(value_node, (*path, key), doc, depth + 1)
        return out
    raise YamlProblem("unsupported YAML node", _mark(node))  # pragma: no cover


def _text(value: str, node: Node) -> str:
    """`value`, unless a `"\\ud800"`-style escape left half a UTF-16 pair in it: such a string
    cannot be written out (logs, /status, kubelet) and means nothing in a config."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise YamlProblem(
            f"escape for U+{ord(value[exc.start]):04X} is half of a UTF-16 surrogate pair, not a "
            "character; write the character itself",
            _mark(node),
        ) from None
    return value


def _short(tag: str) -> str:
    return "!!" + tag[len(_TAG) :] if tag.startswith(_TAG) else tag
