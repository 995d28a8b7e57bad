"""`run` with `memoryLimits`: Allocate caps each replica a container holds, the CDI spec the
caps name is written in `--cdi-dir` first, `/status` says which GPUs enforce, `required`
withdraws what cannot be capped, and a reload that changes the cap reaches new pods only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from daemon_harness import Running, eventually, node_file, running
from support.cdi_schema import cdi_problems

from sharing_plugin.observability.status import StatusBoard

pytestmark = pytest.mark.asyncio

SHARED = "nvidia.com/gpu"
SPEC = "sharing-plugin.io-memory-limit.json"


def t4_node(root: Path, **extra: object) -> str:
    description = {"gpus": [{"product": "Tesla T4", "count": 2}], "driverVersion": "615.25.01"}
    return f"simulated:{node_file(root, {**description, **extra})}"


def hook(root: Path) -> Path:
    path = root / "bin" / "nvidia-cdi-hook"
    path.parent.mkdir()
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


def config(enforce: str, hook_path: Path, replicas: int = 4) -> str:
    return (
        f"version: v1\nmemoryLimits:\n  enforce: {enforce}\n  hookPath: {hook_path}\n"
        f"sharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n      replicas: {replicas}\n"
    )


def envs(run: Running, pod: str) -> dict[str, str]:
    allocation = run.kubelet.pods[("default", pod)].get("c", SHARED)
    return dict(allocation.response.envs)


def cdi_names(run: Running, pod: str) -> list[str]:
    allocation = run.kubelet.pods[("default", pod)].get("c", SHARED)
    return [d.name for d in allocation.response.cdi_devices]


def status(run: Running) -> dict[str, object]:
    board: StatusBoard = run.daemon.status
    return board.to_json()


async def test_a_capped_replica_gets_its_limit_and_a_device_of_the_written_spec(
    short_dir: Path,
) -> None:
    gpus, cdi = t4_node(short_dir), short_dir / "cdi"
    async with running(
        short_dir, config("best-effort", hook(short_dir)), gpus=gpus, cdi_dir=cdi
    ) as run:
        spec = json.loads((cdi / SPEC).read_text())
        assert cdi_problems(spec) == []
        uuids = [d["name"] for d in spec["devices"]]
        assert len(uuids) == 2
        await run.kubelet.admit_pod("p", containers={"c": {SHARED: 2}})
        uuid = run.kubelet.pods[("default", "p")].allocations[0].device_ids[0].split("::")[0]
        per_replica = 15_360 // 4  # a T4's 15 GiB over 4 replicas
        held = run.kubelet.pods[("default", "p")].allocations[0].device_ids
        same_gpu = sum(1 for i in held if i.startswith(uuid))
        limit = str(max(same_gpu, len(held) - same_gpu) * per_replica)
        assert envs(run, "p")["NVIDIA_GPU_MEMORY_LIMIT"] == limit
        assert envs(run, "p")["NVIDIA_GPU_MEMORY_REQUEST"] == limit
        assert f"sharing-plugin.io/memory-limit={uuid}" in cdi_names(run, "p")
        assert status(run)["memoryLimits"] == {
            "enforce": "best-effort",
            "gpus": {u: {"enforced": True, "reason": None} for u in uuids},
        }


async def test_a_reload_changes_the_cap_of_new_pods_only(short_dir: Path) -> None:
    gpus, cdi, path = t4_node(short_dir), short_dir / "cdi", hook(short_dir)
    async with running(short_dir, config("required", path), gpus=gpus, cdi_dir=cdi) as run:
        await run.kubelet.admit_pod("before", containers={"c": {SHARED: 1}})
        assert envs(run, "before")["NVIDIA_GPU_MEMORY_LIMIT"] == str(15_360 // 4)
        run.write(config("required", path, replicas=2))
        await eventually(lambda: run.kubelet.capacity(SHARED) == 4)
        await run.settled()
        await run.kubelet.admit_pod("after", containers={"c": {SHARED: 1}})
        assert envs(run, "after")["NVIDIA_GPU_MEMORY_LIMIT"] == str(15_360 // 2)
        assert envs(run, "before")["NVIDIA_GPU_MEMORY_LIMIT"] == str(15_360 // 4)


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ({"driverVersion": "580.95.05"}, "driver 580.95.05 is older than R615"),
        ({"cgroupVersion": 1}, "the node's cgroup hierarchy is v1"),
    ],
)
async def test_required_withdraws_shares_a_node_cannot_cap(
    short_dir: Path, extra: dict[str, object], reason: str
) -> None:
    gpus = t4_node(short_dir, **extra)
    text = config("required", hook(short_dir))
    async with running(
        short_dir, text, gpus=gpus, cdi_dir=short_dir / "cdi", wait_ready=False
    ) as run:
        await eventually(lambda: "memoryLimits" in status(run))
        await eventually(lambda: SHARED in run.kubelet.resources())
        assert run.kubelet.capacity(SHARED) == 0
        gpus_state = status(run)["memoryLimits"]["gpus"]  # type: ignore[index]
        assert all(not g["enforced"] and reason in g["reason"] for g in gpus_state.values())


async def test_best_effort_without_the_hook_serves_uncapped(short_dir: Path) -> None:
    gpus = t4_node(short_dir)
    text = config("best-effort", short_dir / "missing-hook")
    async with running(short_dir, text, gpus=gpus, cdi_dir=short_dir / "cdi") as run:
        assert run.kubelet.capacity(SHARED) == 8
        await run.kubelet.admit_pod("p", containers={"c": {SHARED: 1}})
        assert "NVIDIA_GPU_MEMORY_LIMIT" not in envs(run, "p")
        assert not any(n.startswith("sharing-plugin.io/") for n in cdi_names(run, "p"))


async def test_a_cdi_dir_that_cannot_be_written_keeps_the_last_good_config(
    short_dir: Path,
) -> None:
    gpus, path = t4_node(short_dir), hook(short_dir)
    blocked = short_dir / "not-a-dir"
    blocked.write_text("")
    plain = config("off", path, replicas=2)
    async with running(short_dir, plain, gpus=gpus, cdi_dir=blocked / "cdi") as run:
        run.write(config("best-effort", path))
        await eventually(lambda: status(run)["lastError"] is not None)
        assert "cannot write the memory-limit CDI spec" in str(status(run)["lastError"])
        assert run.kubelet.capacity(SHARED) == 4  # the last good config still serves


async def test_a_held_replica_stays_advertised_draining_when_required_withdraws_it(
    short_dir: Path,
) -> None:
    gpus, path = t4_node(short_dir), hook(short_dir)
    async with running(
        short_dir, config("required", path), gpus=gpus, cdi_dir=short_dir / "cdi"
    ) as run:
        pod = await run.kubelet.admit_pod("p", containers={"c": {SHARED: 1}})
        (held,) = pod.device_ids("c", SHARED)
        path.unlink()  # the toolkit goes away: no GPU can enforce now
        run.write(config("required", path, replicas=2))  # a reload plans again
        await eventually(lambda: run.kubelet.allocatable(SHARED) == 0)
        # Capacity never lies: the held replica is still advertised, Unhealthy (draining).
        assert run.kubelet.devices(SHARED) == {held: "Unhealthy"}
        assert status(run)["resources"][SHARED]["draining"] == [held]  # type: ignore[index]
        run.kubelet.delete_pod("p")
        await eventually(lambda: run.kubelet.devices(SHARED) == {})


async def test_the_hook_gets_the_nodes_driver_root_when_the_config_names_none(
    short_dir: Path,
) -> None:
    gpus, cdi = t4_node(short_dir), short_dir / "cdi"
    text = config("best-effort", hook(short_dir))
    async with running(
        short_dir, text, gpus=gpus, cdi_dir=cdi, driver_root_default="/run/nvidia/driver"
    ):
        spec = json.loads((cdi / SPEC).read_text())
        (hook_edit,) = spec["devices"][0]["containerEdits"]["hooks"]
        assert hook_edit["args"][2:4] == ["--driver-root", "/run/nvidia/driver"]
