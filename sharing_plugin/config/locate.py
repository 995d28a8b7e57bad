"""Where in the file an admin edits an entry of a config lives.

Validation errors carry their YAML marks already; a problem the plan finds (a device the node
lacks, a MIG layout that cannot fit) and a warning about a valid config only know their dotted
config path. These find that path's line again, so `plan`, warnings and the daemon's reload
errors read like `validate`'s: `FILE:LINE:COL: path: message`. Inside a ConfigMap the line is the
manifest's, not the embedded text's.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sharing_plugin.config.model import Config
from sharing_plugin.config.yamldoc import Document, Mark
from sharing_plugin.config.yamldoc import Path as DocPath
from sharing_plugin.errors import Problem

Remap = Callable[[Mark], Mark]

_PATH_TOKEN = re.compile(r"([^.\[\]]+)|\[(\d+)\]")
_ENTRY_PATH = re.compile(r"([A-Za-z]+)(?:\.[A-Za-z0-9_-]+|\[\d+\])*")
_SECTIONS = frozenset(info.alias or name for name, info in Config.model_fields.items())


def joined(*parts: str) -> str:
    """`a: b: c` of the parts that are not empty."""
    return ": ".join(part for part in parts if part)


def path_parts(path: str) -> DocPath:
    """`sharing.mps.resources[0]` -> `("sharing", "mps", "resources", 0)`."""
    return tuple(
        int(index) if index else key for key, index in _PATH_TOKEN.findall(path) if key or index
    )


def entry_said(line: str) -> tuple[str, str] | None:
    """(path, message) of a `path: message` line about a config entry; None when the line does
    not lead with a config path (a node's own warning, say)."""
    head, sep, message = line.partition(": ")
    match = _ENTRY_PATH.fullmatch(head)
    if not sep or match is None or match.group(1) not in _SECTIONS:
        return None
    return head, message


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a loaded config's entries are written in the file it was read from."""

    file: str
    prefix: str  # "" for a config file, "data.<key>" in a manifest; a stream names the document
    keys: Mapping[DocPath, Mark]
    values: Mapping[DocPath, Mark]
    remap: Remap
    fallback: Mark | None  # a manifest's data key: where an entry that is not written is

    def where(self, path: str) -> Mark | None:
        """The mark of the entry at dotted `path`, or of its closest written ancestor."""
        parts = path_parts(path)
        while parts:
            mark = self.keys.get(parts) or self.values.get(parts)
            if mark is not None:
                return self.remap(mark)
            parts = parts[:-1]
        return self.fallback

    def line(self, path: str, message: str) -> str:
        """`FILE:LINE:COL: [prefix: ]path: message`, as validate prints a problem."""
        return str(self.place(Problem(path, message)))

    def place(self, problem: Problem) -> Problem:
        """`problem` (a config path and a message) at the entry's line, as validation errors
        are: `[prefix: ]path` as its path, this file, and the entry's line and column."""
        mark = self.where(problem.path)
        return Problem(
            joined(self.prefix, problem.path),
            problem.message,
            file=self.file,
            line=mark.line + 1 if mark else None,
            column=mark.column + 1 if mark else None,
        )


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
