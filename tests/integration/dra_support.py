"""Helpers for the DRA tests: a simulated node's plan as DRA devices, and claim documents."""

from __future__ import annotations

from functools import cache
from typing import Any

from sharing_plugin.backends import backend_from_spec
from sharing_plugin.config.base import SharedDevices
from sharing_plugin.config.model import Config
from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.nvml.discover import discover
from sharing_plugin.plan import plan
from sharing_plugin.views.dra import dra_devices, pool_devices
from sharing_plugin.views.dra_api import PublishedDevice


@cache
def inventory(preset: str = "dgx-a100-80gb") -> Inventory:
    return discover(backend_from_spec(f"simulated:{preset}"))


def published_devices(*, gpus: int, replicas: int) -> tuple[PublishedDevice, ...]:
    """The pool of the first `gpus` GPUs of a DGX A100, each shared as `replicas` replicas."""
    node = inventory()
    node = Inventory(gpus=node.gpus[:gpus])
    sharing: dict[str, Any] = {}
    if replicas > 1:
        sharing = {"timeSlicing": {"resources": [{"name": "gpu", "replicas": replicas}]}}
    cfg = Config.model_validate(
        {"version": "v1", "sharing": sharing} if sharing else {"version": "v1"}
    )
    return pool_devices(dra_devices(plan(cfg, node), node, shared=SharedDevices.REPLICAS))
