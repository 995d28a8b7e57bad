"""Who uses the shared GPUs, through a running daemon's /metrics and /status.

The daemon runs on a simulated node whose processes the test edits, a /proc tree holding their
cgroups, the kubelet simulator (which pod holds which replica) and, where the API is used, the
fake kube-apiserver (which pod has which UID and container IDs).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from daemon_harness import eventually
from kube_api import FakeKubeApi
from usage_support import (
    GIB,
    GPU,
    NODE,
    SHARED,
    T4_MEMORY,
    admit,
    cgroup,
    in_pod,
    index_of,
    plugin,
    pod_labels,
    scrape,
    status,
    until,
    write_node,
)

CID = {"a": "a" * 64, "b": "b" * 64}


async def test_pods_named_through_the_api_with_memory_share_and_utilization(
    short_dir: Path,
) -> None:
    async with FakeKubeApi() as api, plugin(short_dir, api=api) as (run, port):
        uid = {
            n: api.put_pod("ml", n, node=NODE, containers={"main": f"containerd://{CID[n]}"})[
                "metadata"
            ]["uid"]
            for n in ("a", "b")
        }
        gpu_a, gpu_b = await admit(run, "a"), await admit(run, "b")
        proc = short_dir / "proc"
        cgroup(proc, 100, in_pod(uid["a"], CID["a"]))
        cgroup(proc, 200, in_pod(uid["b"], CID["b"]))
        cgroup(proc, 300, "0::/system.slice/nvidia-persistenced.service\n")  # a host process
        write_node(
            short_dir / "node.yaml",
            [
                {"gpu": index_of(run, gpu_a), "pid": 100, "memory": "3Gi", "sm": 40},
                {"gpu": index_of(run, gpu_b), "pid": 200, "memory": "5Gi", "sm": 10},
                {"gpu": index_of(run, gpu_b), "pid": 300, "memory": "1Gi"},
            ],
        )
        metrics = await scrape(port)
        memory = metrics["sharing_plugin_pod_gpu_memory_used_bytes"]
        assert memory[pod_labels("a", gpu_a)] == 3 * GIB
        assert memory[pod_labels("b", gpu_b)] == 5 * GIB
        host = pod_labels("", gpu_b, namespace="", container="", resource="")
        assert memory[host] == GIB  # unattributed: empty labels, its pid in /status
        share = metrics["sharing_plugin_pod_gpu_memory_share_bytes"]
        assert share[pod_labels("a", gpu_a)] == T4_MEMORY // 2
        ratio = metrics["sharing_plugin_pod_gpu_utilization_ratio"]
        assert ratio[pod_labels("a", gpu_a)] == 0.4
        assert ratio[pod_labels("b", gpu_b)] == 0.1
        used = metrics["sharing_plugin_gpu_memory_used_bytes"]
        assert used[frozenset({("gpu", gpu_b)})] == 6 * GIB
        replica = metrics["sharing_plugin_replica_memory_share_bytes"]
        assert (
            replica[frozenset({("resource", GPU), ("gpu", gpu_a), ("mig", "")})] == T4_MEMORY // 2
        )

        document = await status(port)
        rows = [
            (c["pod"], c["replicas"], c["memoryUsed"], c["pids"])
            for g in document["usage"]["gpus"]
            for d in g["devices"]
            for c in d["containers"]
            if d["uuid"] == gpu_b
        ]
        assert ("", [], GIB, [300]) in rows
        assert any(r[0] == "b" and r[2] == 5 * GIB and r[3] == [200] for r in rows)

        # pod b leaves: its process ends, kubelet frees its replica, the API deletes it
        write_node(
            short_dir / "node.yaml",
            [{"gpu": index_of(run, gpu_a), "pid": 100, "memory": "3Gi", "sm": 40}],
        )
        run.kubelet.delete_pod("b", "ml")
        api.delete_pod("ml", "b")

        async def b_gone() -> bool:
            series = (await scrape(port))["sharing_plugin_pod_gpu_memory_used_bytes"]
            return (
                not any(("pod", "b") in labels for labels in series)
                and pod_labels("a", gpu_a) in series
            )

        await until(b_gone)


async def test_parallel_scrapes_share_one_nvml_pass(short_dir: Path) -> None:
    async with plugin(short_dir) as (run, port):
        write_node(short_dir / "node.yaml", [{"gpu": 0, "pid": 1, "memory": "1Gi"}])
        before = run.nvml.processes.queries
        await asyncio.gather(*(scrape(port) for _ in range(6)), status(port))
        assert run.nvml.processes.queries - before == 2  # one call per GPU, once


async def test_without_the_api_a_gpu_s_only_holder_is_named(short_dir: Path) -> None:
    async with plugin(short_dir, gpus_count=1) as (run, port):
        (gpu,) = (g.uuid for g in run.nvml.gpus)
        await admit(run, "x")
        # pid 10's cgroup is not visible: kubelet's word decides, and x alone holds the GPU
        write_node(short_dir / "node.yaml", [{"gpu": 0, "pid": 10, "memory": "2Gi"}], gpus=1)
        memory = (await scrape(port))["sharing_plugin_pod_gpu_memory_used_bytes"]
        assert memory == {pod_labels("x", gpu): 2 * GIB}

        await admit(run, "y")  # two holders now: nobody can tell whose pid 11 is
        processes = [{"gpu": 0, "pid": 10, "memory": "2Gi"}, {"gpu": 0, "pid": 11, "memory": "1Gi"}]
        write_node(short_dir / "node.yaml", processes, gpus=1)
        unattributed = pod_labels("", gpu, namespace="", container="", resource="")

        async def both_unattributed() -> bool:
            series = (await scrape(port))["sharing_plugin_pod_gpu_memory_used_bytes"]
            return series.get(unattributed) == 3 * GIB and series.get(pod_labels("y", gpu)) == 0

        await until(both_unattributed)
        (device,) = (await status(port))["usage"]["gpus"][0]["devices"]
        assert [(c["pod"], c["pids"]) for c in device["containers"]] == [
            ("x", []),
            ("y", []),
            ("", [10]),
            ("", [11]),
        ]


async def test_a_pod_over_its_share_gets_events_without_anyone_scraping(short_dir: Path) -> None:
    config = SHARED + "usage:\n  overShareSeconds: 0\n"
    async with FakeKubeApi() as api, plugin(short_dir, config, api=api) as (run, port):
        pod = api.put_pod(
            "ml", "greedy", node=NODE, containers={"main": f"containerd://{CID['a']}"}
        )
        cgroup(short_dir / "proc", 100, in_pod(pod["metadata"]["uid"], CID["a"]))
        gpu = await admit(run, "greedy")
        # 10 GiB of a 15 GiB T4 shared by two: over its half
        write_node(
            short_dir / "node.yaml", [{"gpu": index_of(run, gpu), "pid": 100, "memory": "10Gi"}]
        )

        def filed() -> list[dict[str, Any]]:
            return [e for e in api.events() if e["reason"] == "GpuShareExceeded"]

        await eventually(lambda: len(filed()) == 2, within=10)
        on_pod, on_node = sorted(filed(), key=lambda e: e["involvedObject"]["kind"] != "Pod")
        assert on_pod["involvedObject"] == {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": "greedy",
            "namespace": "ml",
            "uid": pod["metadata"]["uid"],
        }
        assert on_pod["metadata"]["namespace"] == "ml" and on_pod["type"] == "Warning"
        assert on_node["involvedObject"]["kind"] == "Node"
        assert "pod ml/greedy uses 10.0 GiB" in on_pod["message"]
        assert "share of 7.5 GiB (1 replica of nvidia.com/gpu)" in on_pod["message"]
        assert gpu in on_pod["message"]

        metrics = await scrape(port)
        assert metrics["sharing_plugin_gpu_share_exceeded_pods"][frozenset({("gpu", gpu)})] == 1
        assert (
            metrics["sharing_plugin_gpu_share_exceeded_events_total"][frozenset({("gpu", gpu)})]
            == 1
        )

        write_node(
            short_dir / "node.yaml", [{"gpu": index_of(run, gpu), "pid": 100, "memory": "1Gi"}]
        )

        async def back_within() -> bool:
            exceeded = (await scrape(port))["sharing_plugin_gpu_share_exceeded_pods"]
            return exceeded[frozenset({("gpu", gpu)})] == 0

        await until(back_within)
        assert len(filed()) == 2  # nothing more was filed


async def test_a_shorter_over_share_time_applies_to_a_check_already_waiting(
    short_dir: Path,
) -> None:
    async with FakeKubeApi() as api, plugin(short_dir, api=api) as (run, _):
        pod = api.put_pod(
            "ml", "greedy", node=NODE, containers={"main": f"containerd://{CID['a']}"}
        )
        cgroup(short_dir / "proc", 100, in_pod(pod["metadata"]["uid"], CID["a"]))
        gpu = await admit(run, "greedy")  # the check now waits 15 s (a quarter of 60 s)
        write_node(
            short_dir / "node.yaml", [{"gpu": index_of(run, gpu), "pid": 100, "memory": "10Gi"}]
        )
        run.write(SHARED + "usage:\n  overShareSeconds: 0\n")
        await eventually(
            lambda: any(e["reason"] == "GpuShareExceeded" for e in api.events("ml")), within=5
        )
