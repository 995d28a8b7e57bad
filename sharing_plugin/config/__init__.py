"""Config: the model (pure) and its loader.

The names below load on first use (PEP 562): importing one small module of this package, as
`run` does for the default label name, must not build the whole pydantic model first.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sharing_plugin.config.loader import (
        LoadedConfig,
        NamedConfigs,
        dump_config,
        parse_config,
        parse_configs,
    )
    from sharing_plugin.config.model import Config
    from sharing_plugin.config.schema import schema_text
    from sharing_plugin.config.selection import select

__all__ = [
    "Config",
    "LoadedConfig",
    "NamedConfigs",
    "dump_config",
    "parse_config",
    "parse_configs",
    "schema_text",
    "select",
]

_HOME = {"Config": "model", "schema_text": "schema", "select": "selection"}


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(f"{__name__}.{_HOME.get(name, 'loader')}")
    return getattr(module, name)
