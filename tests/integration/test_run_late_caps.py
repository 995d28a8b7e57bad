"""The late mend: a container holding capped replicas whose cgroup has no GPU memory limit (the
runtime never ran the CDI hook) is capped by the plugin at its next usage reading, counted, and
asked no more; a cgroup the hook already capped keeps its limit."""

from __future__ import annotations

from pathlib import Path

from usage_support import admit, cgroup, in_pod, index_of, plugin, scrape, write_node

from sharing_plugin.nvml.memory_limits import MIB

R615 = "615.25.01"
T4_MIB = 15_360
CID = {"a": "a" * 64, "b": "b" * 64}
UID = {"a": "aaaaaaaa-0000-4000-8000-000000000001", "b": "bbbbbbbb-0000-4000-8000-000000000002"}
LATE = "sharing_plugin_memory_limit_applied_late_total"


def capped(hook: Path) -> str:
    return (
        f"version: v1\nmemoryLimits:\n  enforce: best-effort\n  hookPath: {hook}\n"
        "sharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n"
        "        replicas: 2\n"
    )


def scope(pod: str) -> str:
    return in_pod(UID[pod], CID[pod]).removeprefix("0::").strip()


async def test_an_uncapped_cgroup_is_capped_once_and_a_capped_one_is_kept(
    short_dir: Path,
) -> None:
    hook = short_dir / "nvidia-cdi-hook"
    hook.write_text("#!/bin/sh\n")
    hook.chmod(0o755)
    async with plugin(short_dir, capped(hook), driver=R615) as (run, port):
        gpu_a, gpu_b = await admit(run, "a"), await admit(run, "b")
        assert gpu_a != gpu_b  # each pod alone on its GPU: PodResources names the process
        proc = short_dir / "proc"
        cgroup(proc, 100, in_pod(UID["a"], CID["a"]))
        cgroup(proc, 200, in_pod(UID["b"], CID["b"]))
        # The hook ran for pod b's container: its cgroup has its limit already.
        nvml = run.nvml
        nvml.nvmlInit()
        try:
            limits = nvml.c_nvmlSetMemoryLimits_v1_t()
            limits.nameSpace = scope("b").encode()
            limits.softLimit = limits.hardLimit = 1024 * MIB
            nvml.nvmlDeviceSetMemoryLimits_v1(nvml.nvmlDeviceGetHandleByUUID(gpu_b), limits)
        finally:
            nvml.nvmlShutdown()
        write_node(
            short_dir / "node.yaml",
            [
                {"gpu": index_of(run, gpu_a), "pid": 100, "memory": "1Gi"},
                {"gpu": index_of(run, gpu_b), "pid": 200, "memory": "1Gi"},
            ],
            driver=R615,
        )
        metrics = await scrape(port)
        half = T4_MIB // 2
        assert nvml.limits[(gpu_a, scope("a"))] == (half * MIB, half * MIB)
        assert nvml.limits[(gpu_b, scope("b"))] == (1024 * MIB, 1024 * MIB)  # kept
        assert metrics[LATE][frozenset({("gpu", gpu_a)})] == 1
        assert frozenset({("gpu", gpu_b)}) not in metrics[LATE]
        cap = metrics["sharing_plugin_pod_gpu_memory_cap_bytes"]
        assert set(cap.values()) == {half * MIB}
        # The next reading asks nothing more and sets nothing twice.
        await run.daemon.usage.refresh(max_age=0)
        again = await scrape(port)
        assert again[LATE][frozenset({("gpu", gpu_a)})] == 1
