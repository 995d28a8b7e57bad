"""DeviceClasses with extended resource names on a real kube-apiserver 1.36 (tests/realapi.py).

No scheduler runs in the test tools, so extended-resource scheduling itself (an unmodified pod
asking `nvidia.com/gpu: 1` given a claim of the class) is not exercised here: what is proved is
the API side. Every class `run-dra` and `plan --format dra` make, for every example config on
every preset node, passes the server's validation with its `extendedResourceName` kept; the
server refuses a name that is not an extended resource name (so the check is real); and it takes
two classes claiming one name without complaint, which is why ours never share one (the
scheduler would use only the newer). Skipped where ../shared/tools is absent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import realapi
from realapi_support import admin

from sharing_plugin.config.loader import parse_configs
from sharing_plugin.dra.resources import generic, resource_class, status_of
from sharing_plugin.errors import ConfigError, PlanError
from sharing_plugin.nvml.discover import discover
from sharing_plugin.plan.node import plan_node
from sharing_plugin.sim.nvml.node import preset_names
from sharing_plugin.sim.nvml.simulated import SimulatedNvml
from sharing_plugin.views.dra import dra_documents
from sharing_plugin.views.dra_api import V1, device_class

pytestmark = [
    pytest.mark.skipif(not realapi.AVAILABLE, reason=realapi.SKIP_REASON),
    pytest.mark.realtools,
]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "config" / "examples").glob("*.yaml"))
DRIVER = "gpu.sharing-plugin.io"


def every_class() -> dict[str, dict[str, Any]]:
    """Every DeviceClass of every example config on every preset node, by name."""
    classes: dict[str, dict[str, Any]] = {}
    for preset in preset_names():
        inventory = discover(SimulatedNvml.from_preset(preset))
        for example in EXAMPLES:
            try:
                configs = parse_configs(example.read_text(), file=str(example))
            except ConfigError:
                continue
            for loaded in configs.values():
                try:
                    node = plan_node(loaded.config, inventory, as_is=True)
                except PlanError:
                    continue  # a config for other GPUs
                for d in dra_documents(loaded.config, node, "example-node", DRIVER):
                    if d["kind"] == "DeviceClass":
                        classes[d["metadata"]["name"]] = d
    return classes


async def test_every_class_passes_validation_with_its_extended_resource_name(
    real_api: realapi.RealApi,
) -> None:
    classes = every_class()
    claimed = [c["spec"]["extendedResourceName"] for c in classes.values()]
    assert "nvidia.com/gpu" in claimed and len(set(claimed)) == len(claimed)
    async with admin(real_api) as client:
        for name, document in classes.items():
            # Under a name of its own: the run's server is shared, and deploy/dra's classes of
            # the same names may be there already.
            ours = {**document, "metadata": {"name": realapi.unique("class")}}
            stored = (await client.create(generic(V1, ours), dry_run=True)).to_dict()
            assert stored["spec"] == document["spec"], name


async def test_the_server_checks_the_name_but_not_that_it_is_unique(
    real_api: realapi.RealApi,
) -> None:
    async with admin(real_api) as client:
        bad = device_class("nvidia.com/mig-1g.10gb+me", DRIVER)
        bad["metadata"]["name"] = realapi.unique("bad")
        with pytest.raises(Exception) as refused:
            await client.create(generic(V1, bad), dry_run=True)
        status = await status_of(refused.value)
        assert status is not None and status[0] == 422
        assert "must be a valid extended resource name" in status[1]
        # Two classes claiming one name: both stored, nothing refused.
        resource = f"example.com/{realapi.unique('twice')}"
        names = []
        for _ in range(2):
            twin = device_class(resource, DRIVER)
            twin["metadata"]["name"] = realapi.unique("twin")
            names.append((await client.create(generic(V1, twin))).metadata.name)
        kind = resource_class(V1, "DeviceClass")
        stored = [
            (await client.get(kind, n)).to_dict()["spec"]["extendedResourceName"] for n in names
        ]
        assert stored == [resource, resource]
        for name in names:
            await client.delete(kind, name)
