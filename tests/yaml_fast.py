"""YAML for what the tests read and write themselves (rendered manifests, node files they append
to, configs they generate): libyaml's loader and dumper where PyYAML has them. The suite reads
hundreds of manifests and writes thousands of generated configs, and the pure-Python loader and
dumper made that seconds of CPU. What the product reads goes through the product's own reader,
never through this."""

from __future__ import annotations

from typing import IO, Any

import yaml

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def load(text: str | IO[str]) -> Any:
    return yaml.load(text, Loader=_LOADER)


def load_all(text: str | IO[str]) -> list[Any]:
    return list(yaml.load_all(text, Loader=_LOADER))


def dump(data: Any, *, sort_keys: bool = True) -> str:
    """`yaml.safe_dump(data, sort_keys=...)`, through libyaml."""
    text: str = yaml.dump(data, Dumper=_DUMPER, sort_keys=sort_keys)
    return text
