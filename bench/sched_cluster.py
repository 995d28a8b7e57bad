"""What bench/bench_scheduler.py drives a real cluster with: kubelet-less Node objects, pods
with one claim, the admin's plain JSON calls (no typed models: the bench client shares the
cluster's cores), a watch of pods bound, and the scheduler's own metrics."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sys
import time
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx2
import realcluster


def fake_node(name: str) -> dict[str, Any]:
    capacity = {"cpu": "224", "memory": "2Ti", "pods": "110"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "bench": "sched"}},
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": [{"type": "Ready", "status": "True", "reason": "Bench"}],
        },
    }


def claim_spec(device_class: str) -> dict[str, Any]:
    request = {"name": "gpu", "exactly": {"deviceClassName": device_class}}
    return {"devices": {"requests": [request]}}


def pod(name: str, *, template: str | None = None, claim: str | None = None) -> dict[str, Any]:
    source = {"resourceClaimTemplateName": template} if template else {"resourceClaimName": claim}
    container = {
        "name": "main",
        "image": "registry.k8s.io/pause:3.10",
        "resources": {"claims": [{"name": "gpu"}]},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [container],
            "resourceClaims": [{"name": "gpu", **source}],
            "tolerations": [{"operator": "Exists"}],  # kubelet-less nodes get tainted
            "nodeSelector": {"bench": "sched"},
            "terminationGracePeriodSeconds": 0,
        },
    }


class Api:
    """The admin's plain JSON calls (no typed models: the bench client shares 2 cores)."""

    def __init__(self, cluster: realcluster.RealCluster, token: str) -> None:
        headers = {"Authorization": f"Bearer {token}"}
        limits = httpx2.Limits(max_connections=32)
        self.http = httpx2.AsyncClient(
            base_url=cluster.url,
            verify=str(cluster.ca),
            headers=headers,
            limits=limits,
            timeout=120,
        )

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        answer = await self.http.post(path, json=body)
        if answer.status_code >= 300:
            raise RuntimeError(f"POST {path}: {answer.status_code} {answer.text[:400]}")
        created: dict[str, Any] = answer.json()
        return created

    async def get(self, path: str) -> dict[str, Any]:
        answer = await self.http.get(path)
        answer.raise_for_status()
        found: dict[str, Any] = answer.json()
        return found


async def gathered(calls: Iterable[Awaitable[Any]], width: int = 16) -> None:
    """Await `calls`, at most `width` at once."""
    gate = asyncio.Semaphore(width)

    async def one(call: Awaitable[Any]) -> None:
        async with gate:
            await call

    await asyncio.gather(*(one(c) for c in calls))


@dataclass
class Binds:
    """Pods of a namespace bound to a node, as a watch sees them: name -> perf_counter."""

    at: dict[str, float] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def follow(self, api: Api, namespace: str) -> None:
        """Until cancelled; a watch that ends or fails is resumed where it was."""
        path = f"/api/v1/namespaces/{namespace}/pods"
        version = (await api.get(path))["metadata"]["resourceVersion"]
        while True:
            params = {"watch": "1", "resourceVersion": version, "allowWatchBookmarks": "true"}
            try:
                async with api.http.stream("GET", path, params=params, timeout=None) as lines:
                    async for line in lines.aiter_lines():
                        obj = json.loads(line).get("object", {})
                        meta = obj.get("metadata", {})
                        version = meta.get("resourceVersion", version)
                        name = meta.get("name")
                        if obj.get("spec", {}).get("nodeName") and name not in self.at:
                            self.at[name] = time.perf_counter()
                            self.changed.set()
            except (httpx2.HTTPError, ValueError) as exc:
                print(f"pod watch: {exc!r}; resumed", file=sys.stderr, flush=True)

    async def all_of(self, names: set[str], within: float) -> bool:
        """Whether all of `names` were bound within `within` seconds."""
        deadline = time.perf_counter() + within
        while not names <= self.at.keys():
            self.changed.clear()
            left = deadline - time.perf_counter()
            if left <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), left)
        return True


_METRIC = re.compile(r"^(\w+)(?:\{(.*)\})? (\S+)$")


async def scheduler_metrics(api: Api, port: int) -> dict[str, float]:
    """The sums and counts of the scheduler's algorithm (PreFilter to Score, one pod at a
    time; binding is not in it) and of the DynamicResources Filter (per node)."""
    # The scheduler serves a self-signed certificate of its own, on loopback.
    async with httpx2.AsyncClient(verify=False, headers=api.http.headers) as plain:
        answer = await plain.get(f"https://127.0.0.1:{port}/metrics")
    wanted: dict[str, float] = {}
    for line in answer.text.splitlines():
        m = _METRIC.match(line)
        if m is None:
            continue
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        if name.startswith("scheduler_scheduling_algorithm_duration_seconds_"):
            key = "algorithm_" + name.rsplit("_", 1)[1]
        elif name.startswith("scheduler_plugin_execution_duration_seconds_") and (
            'plugin="DynamicResources"' in labels and 'extension_point="Filter"' in labels
        ):
            key = "filter_" + name.rsplit("_", 1)[1]
        else:
            continue
        if key.endswith(("_sum", "_count")):
            wanted[key] = wanted.get(key, 0.0) + value
    return wanted
