"""The JSON Schema of the config, generated from the model (editors use it for help).

The committed `schemas/sharing-config.v1.schema.json` is this text; a test fails when they
drift, so the schema can never document a field the model does not accept.
"""

from __future__ import annotations

import json
from typing import Any

from sharing_plugin.config.model import Config

SCHEMA_ID = "https://github.com/gpu-sharing-plugin/schemas/sharing-config.v1.schema.json"


def config_schema() -> dict[str, Any]:
    schema = Config.model_json_schema(by_alias=True, mode="validation")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        **schema,
        "title": "gpu-sharing-plugin config (v1)",
        "description": (
            "One named config of the sharing plugin: the NVIDIA k8s-device-plugin v1 format "
            "plus declared MIG layouts, per-GPU replicas and health settings."
        ),
    }


def schema_text() -> str:
    """The schema exactly as committed: 2-space JSON, sorted keys, trailing newline."""
    return json.dumps(config_schema(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
