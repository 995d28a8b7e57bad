"""Dynamic MIG slices as a real kube-apiserver 1.36 validates them (server-side dry runs: slices
are cluster-scoped, so each test names its own node and nothing is left behind).

An 8 x A100 node with every GPU dynamic is the largest pool a catalogued node publishes: 8
counter sets (the most one slice may hold) and 8 x 25 placements, each consuming counters (so
at most 64 a slice). The server keeps every counter field (partitionable devices are on in
1.36), accepts counters taken down to 0 by existing instances, and refuses the slices one past
either limit: the limits in views/dra_api.py are the server's.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import realapi
from realapi_support import applied

from sharing_plugin.backends import backend_from_spec
from sharing_plugin.config.loader import parse_config
from sharing_plugin.nvml.discover import discover
from sharing_plugin.plan.node import plan_node
from sharing_plugin.views.dra import dra_documents

pytestmark = [
    pytest.mark.skipif(not realapi.AVAILABLE, reason=realapi.SKIP_REASON),
    pytest.mark.kubectl,
    pytest.mark.realtools,
]

DRIVER = "gpu.sharing-plugin.io"


def documents(devices: str, gpus: str, node: str) -> list[dict[str, Any]]:
    text = f"version: v1\npartitioning:\n  mig:\n    - devices: {devices}\n      dynamic: true\n"
    config = parse_config(text, file="config.yaml").config
    node_plan = plan_node(config, discover(backend_from_spec(gpus)))
    return dra_documents(config, node_plan, node, DRIVER)


def dry_run(api: realapi.RealApi, docs: list[dict[str, Any]]) -> tuple[bool, Any]:
    """`kubectl create --dry-run=server` of the ResourceSlices of `docs`: (accepted, the
    objects as the server would store them, or what it said). The DeviceClasses (cluster-wide
    names another test may have created) go through a server-side apply dry run."""
    classes = [d for d in docs if d["kind"] == "DeviceClass"]
    if classes:
        applied(api, classes, dry_run=True)
    docs = [d for d in docs if d["kind"] != "DeviceClass"]
    listed = json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})
    out = api.kubectl(
        "create", "--dry-run=server", "-o", "json", "-f", "-", stdin=listed, check=False
    )
    decoder, stored, at = json.JSONDecoder(), [], 0
    while at < len(out) and out[at] == "{":  # one JSON object per created object
        item, at = decoder.raw_decode(out, at)
        stored.append(item)
        at = len(out) - len(out[at:].lstrip())
    accepted = not out[at:].strip() and len(stored) == len(docs)
    return accepted, stored if accepted else out


def slices(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == "ResourceSlice"]


def test_an_8_gpu_dynamic_node_passes_validation_and_keeps_every_counter_field(
    real_api: realapi.RealApi,
) -> None:
    node = realapi.unique("mig-node")
    docs = documents("all", "simulated:dgx-a100-80gb", node)
    pool = slices(docs)
    assert [len(s["spec"].get("sharedCounters") or ()) for s in pool] == [8, 0, 0, 0, 0]
    assert [len(s["spec"].get("devices") or ()) for s in pool] == [0, 64, 64, 64, 8]
    accepted, stored = dry_run(real_api, docs)
    assert accepted, stored
    kept = [i for i in stored if i["kind"] == "ResourceSlice"]
    assert [i["spec"].get("sharedCounters") for i in kept] == [
        s["spec"].get("sharedCounters") for s in pool
    ]
    assert [[d.get("consumesCounters") for d in i["spec"].get("devices") or ()] for i in kept] == [
        [d["consumesCounters"] for d in s["spec"].get("devices") or ()] for s in pool
    ]


def test_counters_taken_to_zero_by_existing_instances_are_accepted(
    real_api: realapi.RealApi,
) -> None:
    docs = documents("[0]", "simulated:a100-mig-mixed", realapi.unique("mig-node"))
    (counters,) = [s for s in slices(docs) if s["spec"].get("sharedCounters")]
    values = counters["spec"]["sharedCounters"][0]["counters"]
    assert values["memory-slice-0"] == {"value": "0"}
    accepted, stored = dry_run(real_api, docs)
    assert accepted, stored


def test_one_past_either_limit_is_refused(real_api: realapi.RealApi) -> None:
    docs = slices(documents("all", "simulated:dgx-a100-80gb", realapi.unique("mig-node")))
    counters, devices = docs[0], docs[1]
    nine = copy.deepcopy(counters)
    extra = copy.deepcopy(nine["spec"]["sharedCounters"][0])
    extra["name"] = "one-more"
    nine["spec"]["sharedCounters"].append(extra)
    accepted, said = dry_run(real_api, [nine])
    assert not accepted and "sharedCounters" in said and "must have at most 8" in said, said

    sixty_five = copy.deepcopy(devices)
    sixty_five["spec"]["devices"].append(copy.deepcopy(docs[2]["spec"]["devices"][0]))
    accepted, said = dry_run(real_api, [sixty_five])
    assert not accepted and "must have at most 64" in said, said
