"""What the `plan` command prints: a node's plan or a fleet view, as JSON or as a table.

The JSON keys named by the design are a contract other tools parse; extra keys (`index`,
`replica`, `perDevice`) only add. The node table leads with one line per resource, then each
resource's physical devices with their replica counts, which is what an admin checks first;
the fleet table has one line per node, its problems under it, then the cluster totals.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sharing_plugin.config.quantity import dump_mib
from sharing_plugin.fleet.view import FleetView, NodeStatus
from sharing_plugin.plan.model import Plan, ResourcePlan


def _per_device(resource: ResourcePlan) -> list[dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for d in resource.devices:
        row = rows.get(d.physical)
        if row is None:
            rows[d.physical] = {
                "physical": d.physical,
                "gpu": d.gpu_uuid,
                "index": d.index,
                "numa": d.numa,
                "replicas": 1,
                "shared": d.shared,
                "memoryCapMiB": d.memory_cap_mib,  # each replica's driver cap (memoryLimits)
                "healthy": 1 if d.healthy else 0,
            }
        else:
            row["replicas"] += 1
            row["healthy"] += 1 if d.healthy else 0
    return list(rows.values())


def plan_json(
    plan: Plan,
    *,
    config_name: str | None,
    mig: Sequence[Any] = (),
    warnings: Sequence[str] = (),
    locate: Callable[[str], str] | None = None,
) -> dict[str, Any]:
    """The `plan --format json` document; `warnings` come first (e.g. from discovery).

    `locate` rewrites each of the plan's own warnings, e.g. to lead one about a config entry
    with the `FILE:LINE:COL:` of that entry.
    """
    plan_warnings = list(plan.warnings) if locate is None else list(map(locate, plan.warnings))
    return {
        "config": {"name": config_name},
        "resources": [
            {
                "name": r.name,
                "sharing": r.sharing.value,
                "devices": [
                    {
                        "id": d.id,
                        "physical": d.physical,
                        "health": d.health.value,
                        "numa": d.numa,
                        "index": d.index,
                        "replica": d.replica,
                    }
                    for d in r.devices
                ],
                "perDevice": [
                    {k: v for k, v in row.items() if k != "healthy"} for row in _per_device(r)
                ],
            }
            for r in plan.resources
        ],
        "mig": list(mig),
        "warnings": [*warnings, *plan_warnings],
        **({} if plan.memory_limits is None else {"memoryLimits": plan.memory_limits.document()}),
    }


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    widths = [max([len(h), *(len(row[i]) for row in rows)]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(cells)
        ]
        return "  ".join(parts).rstrip()

    return [line(headers), *(line(row) for row in rows)]


def plan_table(
    plan: Plan,
    *,
    config_name: str | None,
    mig: Sequence[str] = (),
    warnings: Sequence[str] = (),
) -> str:
    """The `plan --format table` text (no trailing newline)."""
    out = [f"config: {config_name or '(unnamed)'}", ""]
    if not plan.resources:
        out.append("no resources: this config advertises nothing on this node")
    else:
        summary = [
            (r.name, str(len(r.devices)), str(r.healthy_count), r.sharing.value)
            for r in plan.resources
        ]
        out += _table(("RESOURCE", "DEVICES", "HEALTHY", "SHARING"), summary, right={1, 2})
    for r in plan.resources:
        out += ["", f"{r.name} ({r.sharing.value})"]
        rows = []
        per_device = _per_device(r)
        capped = any(row["memoryCapMiB"] is not None for row in per_device)
        for row in per_device:
            kind = "MIG" if ":" in row["index"] else "GPU"
            numa = "-" if row["numa"] is None else str(row["numa"])
            replicas = str(row["replicas"]) if row["shared"] else "-"
            health = f"{row['healthy']}/{row['replicas']} healthy"
            cells = ["  " + f"{kind} {row['index']}", row["physical"], replicas, numa, health]
            if capped:
                cap = row["memoryCapMiB"]
                cells.insert(3, "-" if cap is None else dump_mib(cap))
            rows.append(cells)
        headers = ["  DEVICE", "UUID", "REPLICAS", "NUMA", "HEALTH"]
        if capped:
            headers.insert(3, "CAP")
        out += _table(headers, rows, right={2, 3, 4} if capped else {2, 3})
    if mig:
        out += ["", "MIG layout:", *(f"  {line}" for line in mig)]
    if plan.memory_limits is not None:
        out += ["", f"memory limits ({plan.memory_limits.enforce.value}):"]
        for uuid, state in plan.memory_limits.gpus.items():
            said = "enforced" if state.enforced else f"not enforced: {state.reason}"
            out.append(f"  {uuid}  {said}")
    all_warnings = [*warnings, *plan.warnings]
    if all_warnings:
        out += ["", "warnings:", *(f"  - {w}" for w in all_warnings)]
    return "\n".join(out)


def fleet_json(view: FleetView) -> dict[str, Any]:
    """The `plan --nodes --format json` document (its shape is in the contract)."""
    return {
        "nodes": [
            {
                "name": n.name,
                "status": n.status.value,
                "config": n.config,
                "gpus": n.gpus,
                "resources": [
                    {
                        "name": r.name,
                        "devices": r.devices,
                        "physical": r.physical,
                        "sharing": r.sharing,
                        "dra": {"devices": r.dra_devices, "claims": r.dra_claims},
                    }
                    for r in n.resources
                ],
                "mig": list(n.mig),
                "warnings": list(n.warnings),
                "errors": list(n.errors),
                "reason": n.reason,
            }
            for n in view.nodes
        ],
        "totals": {
            "nodes": {
                "total": len(view.nodes),
                **{status.value: view.count(status) for status in NodeStatus},
            },
            "resources": view.totals(),
        },
    }


def fleet_table(view: FleetView) -> str:
    """One line per node (config, GPUs, resources), its problems under it, then the totals."""
    rows = [("NODE", "CONFIG", "GPUS", "RESOURCES")]
    notes: list[list[str]] = [[]]
    for n in view.nodes:
        if n.status is NodeStatus.SKIPPED:
            rows.append((n.name, "-", "-", f"skipped: {n.reason}"))
        else:
            shown = ", ".join(
                f"{r.name}: {r.devices}"
                + (f" ({r.physical} physical)" if r.devices != r.physical else "")
                for r in n.resources
            )
            rows.append(
                (n.name, n.config or "-", n.gpus, shown or ("error" if n.errors else "none"))
            )
        notes.append(
            [f"  error: {e}" for e in n.errors]
            + [f"  mig: {m}" for m in n.mig]
            + [f"  warning: {w}" for w in n.warnings]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines: list[str] = []
    for row, extra in zip(rows, notes, strict=True):
        lines.append(
            "  ".join([*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)), row[3]])
        )
        lines.extend(extra)
    counts = ", ".join(f"{view.count(s)} {s.value}" for s in NodeStatus)
    lines += ["", f"cluster total ({len(view.nodes)} nodes: {counts})"]
    totals = view.totals()
    width = max((len(t["name"]) for t in totals), default=0)
    for t in totals:
        dra = t["dra"]
        lines.append(
            f"  {t['name'].ljust(width)}  {t['devices']:>8,} devices  {t['physical']:>6,} physical"
            f"  on {t['nodes']:,} node(s); DRA: {dra['devices']:,} devices, "
            f"{dra['claims']:,} claims"
        )
    if not totals:
        lines.append("  nothing advertised")
    return "\n".join(lines)
