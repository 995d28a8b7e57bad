"""Config: the model (pure) and its loader."""

from sharing_plugin.config.loader import (
    LoadedConfig,
    NamedConfigs,
    dump_config,
    parse_config,
    parse_configs,
    select,
)
from sharing_plugin.config.model import Config
from sharing_plugin.config.schema import schema_text

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
