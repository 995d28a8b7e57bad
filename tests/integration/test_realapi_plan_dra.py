"""`plan --format dra` applies to a real kube-apiserver unchanged (`../shared/tools/realapi.gz`,
Kubernetes 1.36: its resource.k8s.io/v1 validation, CEL compiled in the DeviceClasses).

Every example config on every simulated preset it fits, printed as an admin would preview it,
then one server-side dry run of all of it: nothing may be refused (the old placeholder node name
`NODE` was: a pool and a node are lower-case DNS names).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import realapi
import yaml_fast
from cli_capture import cli

from sharing_plugin.sim.nvml.node import preset_names

pytestmark = [
    pytest.mark.skipif(not realapi.AVAILABLE, reason=realapi.SKIP_REASON),
    pytest.mark.kubectl,
    pytest.mark.realtools,
]

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "config" / "examples").glob("*.yaml"))


def test_every_plan_format_dra_output_is_accepted_by_the_real_api_server(
    real_api: realapi.RealApi,
) -> None:
    documents: list[dict[str, Any]] = []
    printed = 0
    for preset in preset_names():
        for example in EXAMPLES:
            args = ["plan", "--config", str(example), "--gpus", f"simulated:{preset}"]
            done = cli(*args, "--format", "dra")
            if done.returncode != 0:
                continue  # the config does not fit this preset (test_cli_plan.py knows which)
            documents += list(yaml_fast.load_all(done.stdout))
            printed += 1
    assert printed >= 30
    slices = sum(1 for d in documents if d["kind"] == "ResourceSlice")
    classes = sum(1 for d in documents if d["kind"] == "DeviceClass")
    assert slices and classes
    said = real_api.kubectl(
        "apply",
        "--server-side",
        "--dry-run=server",
        "-f",
        "-",
        stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": documents}),
        check=False,
    )
    assert said.count("serverside-applied (server dry run)") == len(documents), said
