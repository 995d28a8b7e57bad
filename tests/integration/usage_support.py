"""What the per-pod usage tests share: a node file with processes, a /proc tree, HTTP reads."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import yaml_fast
from daemon_harness import Running, running
from kube_api import FakeKubeApi
from plugin_process import free_port, http_get
from prometheus_client.parser import text_string_to_metric_families

from sharing_plugin.plan.model import physical_of
from sharing_plugin.sources.kube import client_from_kubeconfig

NODE = "gpu-node-1"
GPU = "nvidia.com/gpu"
SHARED = """\
version: v1
sharing:
  timeSlicing:
    resources:
      - name: nvidia.com/gpu
        replicas: 2
"""
T4_MEMORY = 15360 << 20
GIB = 1 << 30

Series = dict[frozenset[tuple[str, str]], float]


def write_node(
    path: Path,
    processes: list[dict[str, Any]] | None = None,
    *,
    gpus: int = 2,
    driver: str | None = None,
) -> Path:
    """The simulated node (T4s, the simulator's default driver unless `driver`) with
    `processes`, replaced in one rename as an editor does."""
    tmp = path.with_name(path.name + ".tmp")
    description: dict[str, Any] = {
        "name": "usage",
        "gpus": [{"product": "Tesla T4", "count": gpus}],
        "processes": processes or [],
    }
    if driver is not None:
        description["driverVersion"] = driver
    tmp.write_text(yaml_fast.dump(description))
    tmp.replace(path)
    return path


def cgroup(root: Path, pid: int, text: str) -> None:
    """`<root>/<pid>/cgroup` holding `text`, as /proc shows it."""
    (root / str(pid)).mkdir(parents=True, exist_ok=True)
    (root / str(pid) / "cgroup").write_text(text)


def in_pod(uid: str, container_id: str) -> str:
    """A cgroup v2 line of a burstable pod's containerd container under the systemd driver."""
    return (
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
        f"{uid.replace('-', '_')}.slice/cri-containerd-{container_id}.scope\n"
    )


async def scrape(port: int) -> dict[str, Series]:
    """/metrics over HTTP: sample name -> {labels: value}."""
    code, _, body = await http_get(port, "/metrics")
    assert code == 200
    out: dict[str, Series] = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out.setdefault(s.name, {})[frozenset(s.labels.items())] = s.value
    return out


async def status(port: int) -> dict[str, Any]:
    code, _, body = await http_get(port, "/status")
    assert code == 200
    document: dict[str, Any] = json.loads(body)
    return document


def pod_labels(
    pod: str,
    gpu: str,
    *,
    namespace: str = "ml",
    container: str = "main",
    resource: str = "nvidia.com/gpu",
) -> frozenset[tuple[str, str]]:
    return frozenset(
        {
            ("namespace", namespace),
            ("pod", pod),
            ("container", container),
            ("resource", resource),
            ("gpu", gpu),
            ("mig", ""),
        }
    )


@contextlib.asynccontextmanager
async def plugin(
    root: Path,
    config: str = SHARED,
    *,
    api: FakeKubeApi | None = None,
    gpus_count: int = 2,
    driver: str | None = None,
    **options: Any,
) -> AsyncIterator[tuple[Running, int]]:
    node = write_node(root / "node.yaml", gpus=gpus_count, driver=driver)
    (root / "proc").mkdir()
    port = free_port()
    client = None
    if api is not None:
        api.put_node(NODE)
        client = client_from_kubeconfig(api.kubeconfig(root / "kubeconfig"))
        options = {"node_name": NODE, "kube_client": client, **options}
    try:
        async with running(
            root,
            config,
            gpus=f"simulated:{node}",
            proc_root=root / "proc",
            metrics_address=("127.0.0.1", port),
            **options,
        ) as run:
            yield run, port
    finally:
        if client is not None:
            await client.close()


async def admit(run: Running, name: str) -> str:
    """Admit pod ml/<name> with one replica; the UUID of the GPU it got."""
    pod = await run.kubelet.admit_pod(name, "ml", containers={"main": {GPU: 1}})
    (device_id,) = pod.device_ids("main", GPU)
    return physical_of(device_id)


def index_of(run: Running, gpu: str) -> int:
    return next(g.index for g in run.nvml.gpus if g.uuid == gpu)


async def until(check: Any, within: float = 5.0) -> None:
    """Scrape until `check()` holds; readings are cached for up to a second."""
    async with asyncio.timeout(within):
        while not await check():  # noqa: ASYNC110 -- a new reading is the event, every second
            await asyncio.sleep(0.05)
