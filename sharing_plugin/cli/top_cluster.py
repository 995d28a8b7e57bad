"""`top --cluster`: who uses which GPU on every node, in one table, through the API server.

Every plugin pod's `/status` is read through the API server's pod proxy (credentials as
kubectl finds them: in-cluster, `KUBECONFIG`, `~/.kube/config`), all at once and each within
`--timeout`, so one silent node costs the table that long and no more. One row per container
holding or using a device: node, GPU (its index, `i:j` for a MIG device), the resource and
the replicas it holds, the pod, its memory used / share / cap, its utilization. A device
nobody uses is one row with `-` for the pod; a node whose plugin did not answer is one row
saying why. `--node` reads one node's plugin only; `--namespace` shows only the containers of
that namespace's pods.

Exit codes: 0 (nodes that did not answer are rows, not failures), 1 when the plugin's pods
cannot be listed (no credentials, refused) or none is found.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import sys
import time
from collections.abc import Sequence
from typing import Any

from sharing_plugin.cli.common import EXIT_INVALID, EXIT_OK

DEFAULT_NAMESPACE = "kube-system"
DEFAULT_SELECTOR = "app.kubernetes.io/name=gpu-sharing-plugin"
DEFAULT_TIMEOUT_S = "5"
HEADER = ("NODE", "GPU", "SHARE", "POD", "GiB USED/SHARE/CAP", "UTIL")
_GIB = 1 << 30
_REFRESH_S = 2.0
_CLEAR = "\x1b[H\x1b[2J"


def command(args: argparse.Namespace) -> int:
    try:
        timeout_s = float(args.timeout)
        if timeout_s <= 0:
            raise ValueError
    except ValueError:
        print(
            f"sharing-plugin top: --timeout must be seconds > 0 (got {args.timeout!r})",
            file=sys.stderr,
        )
        return 2
    if args.once:
        lines, status = asyncio.run(_frame(args, timeout_s))
        out = sys.stdout if status == EXIT_OK else sys.stderr
        print("\n".join(lines), file=out)
        return status
    try:
        while True:
            lines, _ = asyncio.run(_frame(args, timeout_s))
            sys.stdout.write(_CLEAR + "\n".join(lines) + "\n")
            sys.stdout.flush()
            time.sleep(_REFRESH_S)
    except KeyboardInterrupt:
        return EXIT_OK


async def _frame(args: argparse.Namespace, timeout_s: float) -> tuple[list[str], int]:
    from sharing_plugin.errors import KubeApiError
    from sharing_plugin.sources.kube import http_from_environment
    from sharing_plugin.sources.plugin_status import node_statuses, plugin_pods

    where = f"pods {args.selector} in namespace {args.plugin_namespace}"
    try:
        http = http_from_environment(timeout_s=timeout_s)
    except KubeApiError as exc:
        return [f"sharing-plugin top: {exc}"], EXIT_INVALID
    if http is None:
        return [
            "sharing-plugin top: no Kubernetes credentials: set KUBECONFIG (or write "
            "~/.kube/config), or run in a pod with a service account"
        ], EXIT_INVALID
    async with http:
        try:
            pods = await plugin_pods(
                http, namespace=args.plugin_namespace, selector=args.selector, node=args.node
            )
        except KubeApiError as exc:
            return [f"sharing-plugin top: {exc}"], EXIT_INVALID
        if not pods:
            on = f" on node {args.node}" if args.node else ""
            return [f"sharing-plugin top: no plugin pod{on}: no {where}"], EXIT_INVALID
        answers = await node_statuses(http, pods, timeout_s=timeout_s)
    rows: list[tuple[str, ...]] = []
    for answer in answers:
        if answer.status is None:
            rows.append((answer.node, "!", "", answer.pod, f"not read: {answer.reason}", ""))
            continue
        rows += node_rows(answer.node, answer.status, namespace=args.namespace)
    stamp = dt.datetime.now().strftime("%H:%M:%S")
    answered = sum(1 for a in answers if a.status is not None)
    title = f"{answered} of {len(answers)} node(s) answered ({where})  {stamp}"
    return [title, *table([HEADER, *rows])], EXIT_OK


def node_rows(
    node: str, document: dict[str, Any], *, namespace: str | None
) -> list[tuple[str, ...]]:
    """The rows of one node's `/status`: a row per container on each device, or one for an
    unused device; with `namespace`, only that namespace's containers."""
    usage = document.get("usage")
    if not isinstance(usage, dict):
        if namespace:
            return []
        return [(node, "-", "", "", "no usage yet: the plugin has not applied a config", "")]
    rows: list[tuple[str, ...]] = []
    for gpu in usage.get("gpus") or ():
        for device in gpu.get("devices") or ():
            rows += _device_rows(node, gpu, device, namespace)
    if not namespace:
        rows += [(node, "!", "", "", str(problem), "") for problem in usage.get("problems") or ()]
    return rows


def _device_rows(
    node: str, gpu: dict[str, Any], device: dict[str, Any], namespace: str | None
) -> list[tuple[str, ...]]:
    index = str(device.get("index", gpu.get("index", "?")))
    label = f"{index} {device['mig']}" if device.get("mig") else f"{index} {gpu.get('product', '')}"
    shares = {s.get("resource"): s for s in device.get("shares") or ()}
    rows: list[tuple[str, ...]] = []
    for c in device.get("containers") or ():
        if namespace and c.get("namespace") != namespace:
            continue
        if c.get("pod"):
            who = "/".join(p for p in (c.get("namespace"), c.get("pod"), c.get("container")) if p)
        else:
            who = f"(pid {', '.join(str(p) for p in c.get('pids') or ())}, unattributed)"
        share = shares.get(c.get("resource"))
        held = len(c.get("replicas") or ())
        of = f" {held}/{share['replicas']}" if share and held else ""
        resource = f"{c.get('resource') or '-'}{of}"
        memory = "/".join(
            (_gib(c.get("memoryUsed")), _gib(c.get("share")) if c.get("pod") else "-", _cap(c))
        )
        if c.get("overShare"):
            memory += " !"
        utilization = c.get("utilization")
        util = f"{round(utilization * 100)}%" if isinstance(utilization, int | float) else "-"
        rows.append((node, label, resource, who, memory, util))
    if not rows and not namespace:
        used = f"{_gib(device.get('memoryUsed'))} of {_gib(device.get('memoryTotal'))} GiB"
        names = ", ".join(str(r) for r in shares) or "-"
        rows.append((node, label, names, "-", used, "-"))
    return rows


def _cap(container: dict[str, Any]) -> str:
    cap = container.get("cap")
    return _gib(cap) if isinstance(cap, int) else "-"


def _gib(value: Any) -> str:
    return f"{(value or 0) / _GIB:.1f}"


def table(rows: Sequence[tuple[str, ...]]) -> list[str]:
    """Rows in columns as wide as their widest cell, as kubectl prints."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "   ".join(f"{c:<{w}}" for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
