"""Which of a ConfigMap's named configs a node uses: the node label's, the requested one,
`default`, or the only one; an unknown name is a problem with a near miss suggested.

Apart from the loader so the loader stays one job (text to validated configs); the rule is the
same for every source (a file, a mounted ConfigMap, the API) and for `plan`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from sharing_plugin.errors import ConfigError, Problem

Loaded = TypeVar("Loaded")


def select(
    configs: Mapping[str | None, Loaded],
    label_value: str | None,
    requested_name: str | None,
) -> tuple[str | None, Loaded]:
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
        close = _close_name(wanted, names)
        hint = f"; did you mean {close!r}?" if close else ""
        raise ConfigError(
            [
                Problem(
                    "", f"unknown config name {wanted!r} ({source}{hint}); available: {available}"
                )
            ]
        )
    return wanted, configs[wanted]


def _close_name(wanted: str, names: list[str]) -> str | None:
    """The name `wanted` probably meant, found as unknown fields' suggestions are."""
    lowered = {name.lower(): name for name in names}
    if wanted.lower() in lowered:
        return lowered[wanted.lower()]
    import difflib  # only a name that matches none needs it: not at every start

    close = difflib.get_close_matches(wanted, names, n=1, cutoff=0.6)
    return close[0] if close else None
