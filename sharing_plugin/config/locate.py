"""Where in the file an admin edits a problem found after validation (by the plan) lives.

Validation errors carry their YAML marks already; a problem the plan finds (a device the node
lacks, a MIG layout that cannot fit) only knows its dotted config path. These functions find
that path's line again in the file, so `plan` and the daemon's reload errors read like
`validate`'s: `FILE:LINE:COL: path: message`.
"""

from __future__ import annotations

import re

from sharing_plugin.config.loader import block_remap
from sharing_plugin.config.yamldoc import Mark, YamlProblem, read

_PATH_TOKEN = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _path_tuple(path: str) -> tuple[str | int, ...]:
    return tuple(
        int(index) if index else key for key, index in _PATH_TOKEN.findall(path) if key or index
    )


def locate(path: str, text: str) -> tuple[int, int] | None:
    """1-based line and column of the config entry at dotted `path` in YAML `text`.

    Falls back to the closest written ancestor (a default value has no line of its own);
    None when the text does not parse or nothing on the path is written.
    """
    try:
        doc = read(text)
    except YamlProblem:
        return None
    parts = _path_tuple(path)
    while parts:
        mark = doc.keys.get(parts) or doc.values.get(parts)
        if mark is not None:
            return mark.line + 1, mark.column + 1
        parts = parts[:-1]
    return None


def locate_in_manifest(path: str, text: str, key: str) -> tuple[int, int] | None:
    """The line of `path` inside the config held by a ConfigMap's `data.<key>`, in the manifest's
    own lines (as validate reports it); the key's line when the entry cannot be found."""
    fallback = locate(f"data.{key}", text)
    try:
        doc = read(text)
    except YamlProblem:
        return fallback
    data = doc.value.get("data") if isinstance(doc.value, dict) else None
    block = data.get(key) if isinstance(data, dict) else None
    if not isinstance(block, str) or not path:
        return fallback
    inner = locate(path, block)
    if inner is None:
        return fallback
    mark = block_remap(doc, key, text.splitlines())(Mark(inner[0] - 1, inner[1] - 1))
    return mark.line + 1, mark.column + 1
