"""Every node's plugin `/status`, read through the API server's pod proxy.

An admin asking who uses which GPU across the cluster should not have to find each plugin pod
and port-forward to it. The API server can reach every pod: `GET
/api/v1/namespaces/<ns>/pods/<pod>:<port>/proxy/status` is the plugin's own `/status`,
authorised as `get` on `pods/proxy` of that pod (the Role that grants it lives in the plugin's
namespace). The plugin's pods are found by their label in that namespace, their port by the
container port named `metrics`.

Each pod is read on its own, all at once, each within `timeout_s`: a node that does not answer
(its pod not running, the proxy refused, the plugin silent) becomes a `NodeStatus` with the
reason, and never holds up the others. The API server answers a proxy it cannot complete with
a Status whose message says why (`dial tcp ...: connect: connection refused`), which is the
reason shown.
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sharing_plugin.errors import KubeApiError

if TYPE_CHECKING:
    import httpx2 as httpx

DEFAULT_PORT = 9400
PORT_NAME = "metrics"


@dataclass(frozen=True, slots=True)
class PluginPod:
    """One plugin pod, as the pod list shows it."""

    name: str
    namespace: str
    node: str
    port: int
    phase: str
    ip: str | None


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """One node's answer: its plugin's `/status`, or why there is none."""

    node: str
    pod: str
    status: dict[str, Any] | None = None
    reason: str | None = None


async def plugin_pods(
    http: httpx.AsyncClient, *, namespace: str, selector: str, node: str | None
) -> list[PluginPod]:
    """The plugin's pods in `namespace` matching `selector` (on `node` only, when given)."""
    params = {"labelSelector": selector}
    if node:
        params["fieldSelector"] = f"spec.nodeName={node}"
    path = f"/api/v1/namespaces/{_quote(namespace)}/pods"
    try:
        response = await http.get(path, params=params)
    except Exception as exc:  # httpx's errors: its package is imported only by the caller
        raise KubeApiError(f"listing pods in {namespace}: {_transport(exc)}") from exc
    if response.status_code != 200:
        raise KubeApiError(
            f"listing pods in {namespace} ({selector}): HTTP {response.status_code}: "
            f"{_message(response.text)}"
        )
    items = response.json().get("items") or []
    return sorted((_pod(item) for item in items), key=lambda p: (p.node, p.name))


def _pod(item: Mapping[str, Any]) -> PluginPod:
    meta, spec, status = item["metadata"], item.get("spec") or {}, item.get("status") or {}
    port = DEFAULT_PORT
    for container in spec.get("containers") or ():
        for declared in container.get("ports") or ():
            if declared.get("name") == PORT_NAME:
                port = int(declared["containerPort"])
    return PluginPod(
        name=meta["name"],
        namespace=meta["namespace"],
        node=spec.get("nodeName") or "",
        port=port,
        phase=status.get("phase") or "Unknown",
        ip=status.get("podIP") or None,
    )


async def node_statuses(
    http: httpx.AsyncClient, pods: list[PluginPod], *, timeout_s: float
) -> list[NodeStatus]:
    """Each pod's `/status` through the pod proxy, in parallel, each bounded by `timeout_s`."""
    return list(await asyncio.gather(*(_read(http, pod, timeout_s) for pod in pods)))


async def _read(http: httpx.AsyncClient, pod: PluginPod, timeout_s: float) -> NodeStatus:
    node = pod.node or "(not scheduled)"
    if pod.phase != "Running" or not pod.ip:
        why = f"pod {pod.name} is {pod.phase}" + ("" if pod.ip else " (no pod IP yet)")
        return NodeStatus(node, pod.name, reason=why)
    path = (
        f"/api/v1/namespaces/{_quote(pod.namespace)}/pods/"
        f"{_quote(pod.name)}:{pod.port}/proxy/status"
    )
    try:
        async with asyncio.timeout(timeout_s):
            response = await http.get(path)
    except TimeoutError:
        return NodeStatus(node, pod.name, reason=f"no answer within {timeout_s:g}s")
    except Exception as exc:  # httpx's errors: its package is imported only by the caller
        return NodeStatus(node, pod.name, reason=_transport(exc))
    if response.status_code != 200:
        reason = f"HTTP {response.status_code}: {_message(response.text)}"
        if response.status_code == 403:
            reason += " (bind the Role sharing-plugin-top; see docs/contract.md, top --cluster)"
        return NodeStatus(node, pod.name, reason=reason)
    try:
        document = json.loads(response.text)
    except ValueError:
        document = None
    if not isinstance(document, dict):
        return NodeStatus(node, pod.name, reason=f"port {pod.port} does not answer /status JSON")
    return NodeStatus(node, pod.name, status=document)


def _message(body: str) -> str:
    """The API server's Status message, else the body's first line."""
    try:
        status = json.loads(body)
    except ValueError:
        status = None
    if isinstance(status, dict) and status.get("message"):
        return str(status["message"])
    first = body.strip().splitlines()[0] if body.strip() else "no body"
    return first[:200]


def _transport(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _quote(part: str) -> str:
    return urllib.parse.quote(part, safe="")
