"""Every label, annotation and Event the plugin writes on its Node, accepted by a real
kube-apiserver's validation (tests/realapi.py): the GFD-compatible labels of every preset node
under every kind of config, and of every MIG profile of the catalog under both MIG strategies;
the config-state label and annotation; an Event of each reason, a repeat (a count bump) and one
past the message limit. Skipped where ../shared/tools is absent.

The writes go through the plugin's own node reporter, which only logs a refused write: the
server's audit log is what says that none was refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import realapi
import yaml_fast
from cli_capture import cli
from lightkube.resources.core_v1 import Event, Node
from realapi_support import a_node_and_its_config, admin, bind, identity, observed

from sharing_plugin.gpus.catalog import MODELS
from sharing_plugin.observability.nodestatus import NodeStatusReporter
from sharing_plugin.sources.kube import client_from_kubeconfig

pytestmark = [
    pytest.mark.skipif(not realapi.AVAILABLE, reason=realapi.SKIP_REASON),
    pytest.mark.kubectl,
    pytest.mark.realtools,
]

PRESETS = sorted(
    p.stem for p in (Path(__file__).parents[2] / "sharing_plugin/sim/nvml/presets").glob("*.yaml")
)
CONFIGS = {
    "whole": "version: v1\n",
    "time-sliced": (
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        "      - name: nvidia.com/gpu\n        replicas: 4\n"
    ),
    "renamed": (
        "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n"
        "      - name: nvidia.com/gpu\n        replicas: 2\n"
    ),
    "mps": (
        "version: v1\nsharing:\n  mps:\n    resources:\n"
        "      - name: nvidia.com/gpu\n        replicas: 2\n"
    ),
    "mig-mixed": "version: v1\nflags:\n  migStrategy: mixed\n",
    "mig-single": "version: v1\nflags:\n  migStrategy: single\n",
}
REASONS = (
    "ConfigApplied",
    "ConfigRejected",
    "MigLayoutPending",
    "MigLayoutApplied",
    "GpuUnhealthy",
    "GpuRecovered",
)
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


def planned_labels(config: Path, gpus: str) -> dict[str, str] | None:
    """What `plan --format labels` prints (the labels `--node-labels on` writes); None when the
    config does not fit the node."""
    done = cli("plan", "--config", str(config), "--gpus", gpus, "--format", "labels")
    if done.returncode != 0:
        return None
    return dict(line.split("=", 1) for line in done.stdout.splitlines())


def label_sets(tmp: Path) -> dict[str, dict[str, str]]:
    """Every label set to write, by what it is of."""
    sets: dict[str, dict[str, str]] = {}
    for name, text in CONFIGS.items():
        (tmp / f"{name}.yaml").write_text(text)
    for preset in PRESETS:
        for name in CONFIGS:
            found = planned_labels(tmp / f"{name}.yaml", f"simulated:{preset}")
            if found is not None:
                sets[f"{preset}/{name}"] = found
    for model in MODELS:
        if model.mig is None:
            continue
        product, profiles = model.products[0], [p.name for p in model.mig.profiles]
        # One GPU per profile (mixed: every profile's labels at once), and each profile alone
        # (single: its name in gpu.product).
        for what, instances in [("all", profiles), *((p, [p]) for p in profiles)]:
            node = tmp / f"{model.name}-{what}.yaml"
            gpus = [
                {"product": product, "mig": {"enabled": True, "instances": [i]}} for i in instances
            ]
            node.write_text(yaml_fast.dump({"gpus": gpus}))
            strategy = "mig-mixed" if what == "all" else "mig-single"
            found = planned_labels(tmp / f"{strategy}.yaml", f"simulated:{node}")
            assert found is not None, (model.name, what)
            sets[f"{model.name}/{what}/{strategy}"] = found
    return sets


async def test_no_label_annotation_or_event_the_plugin_writes_is_refused(
    real_api: realapi.RealApi, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sets = label_sets(tmp_path)
    profiles = {p.name for m in MODELS if m.mig for p in m.mig.profiles}
    written = {k.split("/")[1] for k in sets if k.count("/") == 2 and k.endswith("mig-single")}
    assert written == profiles  # every profile's single-strategy labels are among them
    for what, labels in sets.items():  # what the server checks, said here for a clear failure
        bad = {v for v in labels.values() if len(v) > 63 or not _LABEL_VALUE.fullmatch(v)}
        assert not bad, (what, bad)

    async with admin(real_api) as cluster:
        namespace, node = await a_node_and_its_config(cluster, data={})
        await bind(cluster, namespace, "plugin", "cluster-admin")
        plugin = identity(real_api, tmp_path, namespace=namespace, account="plugin")
        client = client_from_kubeconfig(plugin.kubeconfig)
        reporter = NodeStatusReporter(client, node)
        try:
            async with _running(reporter):
                for labels in sets.values():
                    reporter.labels(labels)
                for state in ("pending", "failed", "success"):
                    reporter.state(state, "default@0123456789abcdef")
                for reason in REASONS:
                    reporter.event(reason, f"{reason}: what happened on {node}", warning=True)
                reporter.event("ConfigApplied", f"ConfigApplied: what happened on {node}")
                reporter.event("ConfigRejected", "x" * 5000)  # cut to the reporter's limit
                await reporter.flush()
        finally:
            await client.close()
        last = list(sets.values())[-1]
        nodes = await observed(cluster, Node, lambda n: True, fields={"metadata.name": node})
        on_node = nodes[node].metadata.labels
        assert {k: on_node.get(k) for k in last} == last  # the last set landed...
        stale = {k for labels in sets.values() for k in labels} - last.keys()
        assert not stale & on_node.keys()  # ...and the keys only earlier sets had are gone
        events = await observed(
            cluster,
            Event,
            lambda found: len(found) == len(REASONS) + 1,
            namespace="default",
            fields={"involvedObject.name": node},
        )
        assert {e.reason for e in events.values()} == set(REASONS)
    refused = [e for e in real_api.audit(plugin.user) if e["responseStatus"]["code"] >= 400]
    assert not refused, [(e["requestURI"], e["responseStatus"]) for e in refused]
    writes = [e for e in real_api.audit(plugin.user) if e["verb"] in ("patch", "create")]
    assert len(writes) >= len(sets) + len(REASONS) + 2
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@contextlib.asynccontextmanager
async def _running(reporter: NodeStatusReporter) -> AsyncIterator[None]:
    """The reporter's writer task, for the duration of a block."""
    task = asyncio.create_task(reporter.run(), name="node-status")
    try:
        yield
    finally:
        task.cancel()
        await asyncio.wait([task])
