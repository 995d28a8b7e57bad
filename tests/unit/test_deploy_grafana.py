"""deploy/grafana's dashboard asks only for what the plugin exports, and says in what unit."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from sharing_plugin.observability.metrics import Metrics
from sharing_plugin.observability.usage import UsageExposition

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "gpu-sharing-plugin.json"
_NAME = re.compile(r"\bsharing_plugin_[a-zA-Z0-9_]+")
# Grafana's unit ids the dashboard may use (its "Standard options > Unit" list).
UNITS = {"bytes", "short", "percentunit", "bool_yes_no", "none", "s"}


def exported() -> set[str]:
    """Every sample name a running `run`'s /metrics carries (counters with `_total`)."""
    metrics = Metrics(version="test")
    metrics.add_exposition(UsageExposition(lambda: None).text)
    names: set[str] = set()
    for family in text_string_to_metric_families(metrics.render().decode()):
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names |= {f"{family.name}_{s}" for s in ("bucket", "sum", "count")}
        else:
            names.add(family.name)
    return names


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in dashboard["panels"]:
        out += [panel, *panel.get("panels", [])]
    return out


def queries(dashboard: dict[str, Any]) -> list[str]:
    found = [t["expr"] for p in panels(dashboard) for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            found.append(query["query"])
    return found


def test_every_query_names_only_metrics_the_plugin_exports() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    known = exported()
    asked = queries(dashboard)
    assert asked, "the dashboard queries nothing"
    for expr in asked:
        named = set(_NAME.findall(expr))
        assert named, f"no plugin metric in {expr!r}"
        assert named <= known, f"{expr!r}: not exported: {sorted(named - known)}"


def test_every_panel_has_a_unit() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    shown = [p for p in panels(dashboard) if p["type"] != "row"]
    assert shown
    for panel in shown:
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
        assert unit in UNITS, f"panel {panel['title']!r}: unit {unit!r}"
        assert panel["targets"], panel["title"]


def test_the_issue_s_views_are_there() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = " ".join(queries(dashboard))
    for metric in (
        "sharing_plugin_gpu_replicas_in_use",  # replicas in use per GPU
        "sharing_plugin_pod_gpu_memory_used_bytes",  # per-pod memory ...
        "sharing_plugin_pod_gpu_memory_share_bytes",  # ... against its share
        "sharing_plugin_gpu_share_exceeded_events_total",  # over-share events
        "sharing_plugin_reloads_total",  # reloads
        "sharing_plugin_gpu_healthy",  # health
    ):
        assert metric in exprs, metric
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids))
