"""MPS in the plan: one control daemon per MPS resource, its limits, and sizes by memory."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from typing import Any

import pytest
import yaml_fast
from plan_factory import gpu, gpu_uuid, mps, node, time_slicing

from sharing_plugin.config.loader import dump_config, parse_config
from sharing_plugin.config.model import Config, Flags
from sharing_plugin.errors import AllocationError, ConfigError, PlanError
from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.plan import allocate, plan

GIB = 1024


def mixed() -> Inventory:
    """A 40 GB and an 80 GB GPU (as NVML counts them: 40960 and 81920 MiB)."""
    return node(replace(gpu(0), memory_mib=40 * GIB), gpu(1))


def test_the_reference_limits_memory_and_threads_split_evenly() -> None:
    p = plan(mps({"name": "gpu", "replicas": 4}, **{"renameByDefault": False}), mixed())
    (daemon,) = p.mps
    assert daemon.resource == "nvidia.com/gpu"
    assert daemon.root == "/run/nvidia/mps/nvidia.com/gpu"
    assert daemon.pipe_directory == "/run/nvidia/mps/nvidia.com/gpu/pipe"
    assert daemon.log_directory == "/run/nvidia/mps/nvidia.com/gpu/log"
    assert daemon.gpus == (gpu_uuid(0), gpu_uuid(1))
    assert [d.pinned_memory_limit for d in daemon.devices] == ["10240M", "20480M"]
    assert daemon.active_thread_percentage == 25


def test_memory_per_replica_gives_each_gpu_what_its_memory_holds() -> None:
    cfg = mps({"name": "gpu", "rename": "gpu-10gb", "memoryPerReplica": "10Gi"})
    p = plan(cfg, mixed())
    (res,) = p.resources
    assert res.name == "nvidia.com/gpu-10gb"
    assert res.replicas_by_physical() == {gpu_uuid(0): 4, gpu_uuid(1): 8}
    (daemon,) = p.mps
    assert [d.pinned_memory_limit for d in daemon.devices] == ["10240M", "10240M"]
    # One default per daemon: the share every client fits in (100 / 8).
    assert daemon.active_thread_percentage == 12


def test_explicit_limits_override_the_split() -> None:
    entry = {
        "name": "gpu",
        "replicas": 2,
        "activeThreadPercentage": 30,
        "pinnedMemoryLimit": "8Gi",
    }
    (daemon,) = plan(mps(entry), mixed()).mps
    assert daemon.active_thread_percentage == 30
    assert [d.pinned_memory_limit for d in daemon.devices] == ["8192M", "8192M"]


def test_the_fingerprint_follows_gpus_and_limits_only() -> None:
    four = plan(mps({"name": "gpu", "replicas": 4}), mixed()).mps[0]
    same = plan(mps({"name": "gpu", "replicas": 4}, failRequestsGreaterThanOne=False), mixed())
    two = plan(mps({"name": "gpu", "replicas": 2}), mixed()).mps[0]
    one_gpu = plan(mps({"name": "gpu", "replicas": 4, "devices": [0]}), mixed()).mps[0]
    assert same.mps[0].fingerprint == four.fingerprint
    assert len({four.fingerprint, two.fingerprint, one_gpu.fingerprint}) == 3


def test_multi_user_is_in_the_fingerprint_only_when_on() -> None:
    single = plan(mps({"name": "gpu", "replicas": 4}), mixed()).mps[0]
    multi = plan(mps({"name": "gpu", "replicas": 4}, multiUser=True), mixed()).mps[0]
    off = plan(mps({"name": "gpu", "replicas": 4}, multiUser=False), mixed()).mps[0]
    assert (single.multi_user, multi.multi_user) == (False, True)
    assert multi.limits() == single.limits()
    # -M is a start flag: turning it on or off restarts the daemon...
    assert multi.fingerprint != single.fingerprint
    # ...while daemons of configs that never set it keep the fingerprint they started with.
    started_for = {"gpus": single.gpus, **single.limits(), "root": single.root}
    text = json.dumps(started_for, sort_keys=True).encode()
    assert single.fingerprint == off.fingerprint == hashlib.sha256(text).hexdigest()[:16]
    assert single.shm_directory == "/run/nvidia/mps/shm"


def test_no_daemon_without_mps() -> None:
    assert plan(time_slicing({"name": "gpu", "replicas": 4}), mixed()).mps == ()
    only_gpu_1 = plan(mps({"name": "gpu", "replicas": 2, "devices": [1]}), mixed())
    assert only_gpu_1.mps[0].gpus == (gpu_uuid(1),)


def test_limits_above_the_gpu_memory_need_oversubscribe() -> None:
    entry: dict[str, Any] = {"name": "gpu", "replicas": 4, "pinnedMemoryLimit": "15Gi"}
    with pytest.raises(PlanError) as err:
        plan(mps(entry), mixed())
    (problem,) = err.value.problems
    assert problem.path == "sharing.mps.resources[0].pinnedMemoryLimit"
    assert "4 clients x 15Gi = 60Gi exceed GPU 0" in problem.message

    allowed = plan(mps({**entry, "oversubscribe": 1.5}), mixed())
    assert [w for w in allowed.warnings if "oversubscribe GPU 0" in w]
    assert allowed.mps[0].devices[0].pinned_memory_limit == "15360M"

    with pytest.raises(PlanError, match="more than all of GPU 0"):
        plan(mps({"name": "gpu", "replicas": 1, "pinnedMemoryLimit": "50Gi"}), mixed())


def test_memory_per_replica_above_the_client_limit_or_the_gpu_is_refused() -> None:
    with pytest.raises(PlanError) as err:
        plan(mps({"name": "gpu", "memoryPerReplica": "1Gi"}), mixed())
    (problem,) = err.value.problems
    assert problem.path == "sharing.mps.resources[0].memoryPerReplica"
    assert "80 replicas exceed the 48 clients MPS serves on GPU 1" in problem.message
    assert "raise it to at least 1707Mi" in problem.message
    with pytest.raises(PlanError, match="holds no client of this size"):
        plan(mps({"name": "gpu", "memoryPerReplica": "50Gi"}), mixed())


def test_oversubscribe_sizes_replicas_by_memory_too() -> None:
    cfg = mps({"name": "gpu", "memoryPerReplica": "20Gi", "oversubscribe": 2})
    p = plan(cfg, mixed())
    assert p.resources[0].replicas_by_physical() == {gpu_uuid(0): 4, gpu_uuid(1): 8}
    assert any("oversubscribe GPU 1" in w for w in p.warnings)


def load(entry: str) -> ConfigError | dict[str, Any]:
    text = f"version: v1\nsharing:\n  mps:\n    resources:\n    - name: gpu\n{entry}"
    try:
        return dump_config(parse_config(text, file="c.yaml").config)
    except ConfigError as exc:
        return exc


@pytest.mark.parametrize(
    ("entry", "line"),
    [
        ("", "c.yaml:5:7: sharing.mps.resources[0]: say how many clients share each GPU"),
        (
            "      replicas: 2\n      memoryPerReplica: 10Gi\n",
            "c.yaml:7:25: sharing.mps.resources[0].memoryPerReplica: replicas and "
            "memoryPerReplica both size the resource",
        ),
        ("      replicas: 0\n", "c.yaml:6:17: sharing.mps.resources[0].replicas: must be >= 1"),
        (
            "      memoryPerReplica: 10240\n",
            "c.yaml:6:25: sharing.mps.resources[0].memoryPerReplica: write a size with its unit",
        ),
        (
            "      replicas: 2\n      pinnedMemoryLimit: 10GB\n",
            "c.yaml:7:26: sharing.mps.resources[0].pinnedMemoryLimit: '10GB' is not a size",
        ),
        (
            "      replicas: 2\n      activeThreadPercentage: 0\n",
            "c.yaml:7:31: sharing.mps.resources[0].activeThreadPercentage: must be >= 1",
        ),
        (
            "      replicas: 2\n      oversubscribe: 0.5\n",
            "c.yaml:7:22: sharing.mps.resources[0].oversubscribe: must be >= 1",
        ),
        (
            "      replicas: 2\n      pinnedMemory: 1Gi\n",
            "unknown field 'pinnedMemory' (did you mean 'pinnedMemoryLimit'?)",
        ),
    ],
)
def test_mps_entries_are_validated_at_their_lines(entry: str, line: str) -> None:
    found = load(entry)
    assert isinstance(found, ConfigError)
    assert line in str(found)


def test_time_slicing_takes_no_mps_only_keys() -> None:
    text = (
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n"
        "      replicas: 2\n      pinnedMemoryLimit: 10Gi\n"
    )
    with pytest.raises(ConfigError, match="unknown field 'pinnedMemoryLimit'"):
        parse_config(text, file="c.yaml")


def test_time_slicing_is_sized_once() -> None:
    text = (
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n"
        "      replicas: 2\n      memoryPerReplica: 10Gi\n"
    )
    with pytest.raises(ConfigError) as raised:
        parse_config(text, file="c.yaml")
    assert [str(p) for p in raised.value.problems] == [
        "c.yaml:7:25: sharing.timeSlicing.resources[0].memoryPerReplica: replicas and "
        "memoryPerReplica both size the resource: keep one of them"
    ]


def test_sizes_dump_and_load_back() -> None:
    dumped = load("      memoryPerReplica: 1.5Gi\n      pinnedMemoryLimit: 2G\n")
    assert isinstance(dumped, dict)
    (entry,) = dumped["sharing"]["mps"]["resources"]
    assert entry["memoryPerReplica"] == "1536Mi"
    assert entry["pinnedMemoryLimit"] == "1907Mi"  # 2e9 bytes, whole MiB
    assert "replicas" not in entry
    again = parse_config(yaml_fast.dump(dumped), file="d.yaml").config
    assert dump_config(again) == dumped


@pytest.mark.parametrize(
    "strategy",
    ["envvar", "volume-mounts", "cdi-annotations", "cdi-cri", ["envvar", "cdi-cri"]],
)
def test_every_strategy_gets_the_pipe_directory_and_shm(strategy: object) -> None:
    base = dump_config(mps({"name": "gpu", "replicas": 2}, failRequestsGreaterThanOne=False))
    cfg = Config.model_validate({**base, "flags": {"plugin": {"deviceListStrategy": strategy}}})
    (res,) = plan(cfg, mixed()).resources
    given = allocate(res, [res.devices[0].id, res.devices[1].id], cfg.flags)
    assert given.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/nvidia.com/gpu/pipe"
    mounts = {m.container_path: m.host_path for m in given.mounts}
    assert mounts["/mps/nvidia.com/gpu/pipe"] == "/run/nvidia/mps/nvidia.com/gpu/pipe"
    assert mounts["/dev/shm"] == "/run/nvidia/mps/shm"


def test_more_than_one_replica_follows_fail_requests_greater_than_one() -> None:
    (refusing,) = plan(mps({"name": "gpu", "replicas": 2}), mixed()).resources
    two = [refusing.devices[0].id, refusing.devices[1].id]
    with pytest.raises(AllocationError, match="maximum request size for shared resources is 1"):
        allocate(refusing, two, Flags())
    allowing = mps({"name": "gpu", "replicas": 2}, failRequestsGreaterThanOne=False)
    (res,) = plan(allowing, mixed()).resources
    assert allocate(res, two, allowing.flags).physical == (gpu_uuid(0),)
