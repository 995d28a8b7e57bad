"""YAML for what the tests read themselves (rendered manifests, node files they append to):
libyaml's loader where PyYAML has it. The suite reads hundreds of manifests, and the
pure-Python loader made that seconds of CPU. What the product reads goes through the product's
own reader, never through this."""

from __future__ import annotations

from typing import IO, Any

import yaml

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load(text: str | IO[str]) -> Any:
    return yaml.load(text, Loader=_LOADER)


def load_all(text: str | IO[str]) -> list[Any]:
    return list(yaml.load_all(text, Loader=_LOADER))
