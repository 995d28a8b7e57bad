"""Which GPUs keep their shares' caps, what `required` and `best-effort` then advertise, and the
Allocate answer and CDI spec of a capped replica."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from plan_factory import config, gpu, gpu_uuid, node
from support.cdi_schema import cdi_problems

from sharing_plugin.config.base import SharedDevices
from sharing_plugin.config.model import Config, Flags
from sharing_plugin.gpus.inventory import Gpu, Inventory
from sharing_plugin.plan import allocate, plan
from sharing_plugin.plan.allocate import MEMORY_LIMIT, MEMORY_REQUEST, memory_limit_cdi_id
from sharing_plugin.plan.caps import NodeFacts
from sharing_plugin.sources.host import hook_problem, host_cgroup_version
from sharing_plugin.views.cdi import claim_spec
from sharing_plugin.views.cdi_memory import memory_limit_spec, spec_file_name
from sharing_plugin.views.dra import dra_devices

READY = NodeFacts(cgroup_version=2, hook_problem=None)


def r615(*gpus: Gpu, driver: str = "615.25.01") -> Inventory:
    return replace(node(*gpus), driver_version=driver)


def capped(enforce: str, *entries: dict[str, object], **sections: object) -> Config:
    resources = list(entries) or [{"name": "gpu", "replicas": 4}]
    return config(
        memoryLimits={"enforce": enforce},
        sharing={"timeSlicing": {"resources": resources}},
        **sections,
    )


def reason_of(cfg: Config, inventory: Inventory, facts: NodeFacts) -> str | None:
    state = plan(cfg, inventory, facts=facts).memory_limits
    assert state is not None
    (gpu_state,) = state.gpus.values()
    return gpu_state.reason


@pytest.mark.parametrize(
    ("driver", "facts", "reason"),
    [
        ("615.25.01", READY, None),
        (
            "580.95.05",
            READY,
            "driver 580.95.05 is older than R615, the first to cap a cgroup's memory",
        ),
        (
            "615.25.01",
            replace(READY, cgroup_version=1),
            "the node's cgroup hierarchy is v1: caps need cgroup v2",
        ),
        (
            "615.25.01",
            replace(READY, cgroup_version=None),
            "the node's cgroup hierarchy is unknown: caps need cgroup v2",
        ),
        ("615.25.01", replace(READY, hook_problem="no hook"), "no hook"),
    ],
)
def test_each_prerequisite_is_named_when_missing(
    driver: str, facts: NodeFacts, reason: str | None
) -> None:
    assert reason_of(capped("best-effort"), r615(gpu(0), driver=driver), facts) == reason


def test_best_effort_advertises_everything_and_caps_where_it_can() -> None:
    cfg = capped("best-effort")
    kept = plan(cfg, r615(gpu(0), driver="550.54.15"), facts=READY)
    assert len(kept.resource("nvidia.com/gpu").devices) == 4
    assert {d.memory_cap_mib for d in kept.resources[0].devices} == {None}
    assert any("advertised uncapped" in w for w in kept.warnings)
    enforced = plan(cfg, r615(gpu(0)), facts=READY)
    assert {d.memory_cap_mib for d in enforced.resources[0].devices} == {81_920 // 4}


def test_required_withdraws_the_shares_a_gpu_cannot_cap() -> None:
    cfg = capped("required", {"name": "gpu", "replicas": 2, "devices": [0]})
    p = plan(cfg, r615(gpu(0), gpu(1)), facts=replace(READY, hook_problem="no hook"))
    # The unshared GPU 1 carries no cap and stays; GPU 0's replicas go.
    assert [d.id for d in p.resource("nvidia.com/gpu").devices] == [gpu_uuid(1)]
    assert any("not advertised (memoryLimits.enforce: required)" in w for w in p.warnings)
    state = p.memory_limits
    assert state is not None and state.document()["enforce"] == "required"


def test_a_mig_gpu_is_reported_isolated() -> None:
    cfg = capped("best-effort", flags={"migStrategy": "mixed"})
    state = plan(cfg, r615(gpu(0, migs=("7g.80gb",)), gpu(1)), facts=READY).memory_limits
    assert state is not None
    assert state.document()["gpus"] == {
        gpu_uuid(0): {
            "enforced": False,
            "reason": "MIG mode is on: its devices are isolated already",
        },
        gpu_uuid(1): {"enforced": True, "reason": None},
    }


def test_allocate_caps_the_replicas_a_container_holds() -> None:
    p = plan(capped("required", {"name": "gpu", "replicas": 4}), r615(gpu(0)), facts=READY)
    resource = p.resource("nvidia.com/gpu")
    assert resource is not None
    ids = [d.id for d in resource.devices[:2]]
    for strategy in ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri"):
        flags = config(flags={"plugin": {"deviceListStrategy": strategy}}).flags
        answer = allocate(resource, ids, flags)
        assert answer.envs[MEMORY_REQUEST] == answer.envs[MEMORY_LIMIT] == str(2 * 20_480)
        assert answer.cdi_devices[-1:] == (memory_limit_cdi_id(gpu_uuid(0)),), strategy
        assert answer.note is None


def test_two_gpus_share_one_limit_the_larger_and_say_so() -> None:
    small = replace(gpu(1), memory_mib=40_960)
    p = plan(capped("best-effort"), r615(gpu(0), small), facts=READY)
    resource = p.resource("nvidia.com/gpu")
    assert resource is not None
    by_gpu = {d.gpu_uuid: d.id for d in resource.devices}
    answer = allocate(resource, [by_gpu[gpu_uuid(0)], by_gpu[gpu_uuid(1)]], p_flags())
    assert answer.envs[MEMORY_LIMIT] == str(20_480)
    assert set(answer.cdi_devices) == {
        memory_limit_cdi_id(gpu_uuid(0)),
        memory_limit_cdi_id(gpu_uuid(1)),
    }
    assert answer.note is not None and "capped at the larger, 20480 MiB" in answer.note


def test_uncapped_replicas_get_no_limit() -> None:
    p = plan(capped("off"), r615(gpu(0)), facts=READY)
    resource = p.resource("nvidia.com/gpu")
    assert resource is not None
    answer = allocate(resource, [resource.devices[0].id], p_flags())
    assert MEMORY_LIMIT not in answer.envs and answer.cdi_devices == ()


def p_flags() -> Flags:
    return config().flags


def test_the_spec_has_one_hooked_device_per_gpu() -> None:
    spec = memory_limit_spec(
        [gpu_uuid(0), gpu_uuid(1)],
        hook_path="/usr/local/nvidia/toolkit/nvidia-cdi-hook",
        driver_root="/run/nvidia/driver",
    )
    assert spec_file_name() == "sharing-plugin.io-memory-limit.json"
    assert spec["kind"] == "sharing-plugin.io/memory-limit"
    first = spec["devices"][0]
    assert first["name"] == gpu_uuid(0)
    assert first["containerEdits"]["hooks"] == [
        {
            "hookName": "createRuntime",
            "path": "/usr/local/nvidia/toolkit/nvidia-cdi-hook",
            "args": [
                "nvidia-cdi-hook",
                "apply-cuda-memory-limits",
                "--driver-root",
                "/run/nvidia/driver",
                "--gpu-id",
                gpu_uuid(0),
            ],
        }
    ]
    json.dumps(spec)  # a plain document


def test_the_host_probe_reads_the_cgroup_mount_and_the_hook(tmp_path: Path) -> None:
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cgroup.controllers").write_text("cpu memory\n")
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    assert host_cgroup_version(v2) == 2
    assert host_cgroup_version(v1) == 1
    assert host_cgroup_version(tmp_path / "none") is None
    hook = tmp_path / "nvidia-cdi-hook"
    assert hook_problem(str(hook)) is not None
    hook.write_text("#!/bin/sh\n")
    assert hook_problem(str(hook)) == f"the CDI hook {hook} is not an executable file"
    hook.chmod(0o755)
    assert hook_problem(str(hook)) is None


def test_the_memory_spec_keeps_the_cdi_schema() -> None:
    spec = memory_limit_spec([gpu_uuid(0)], hook_path="/usr/bin/nvidia-cdi-hook", driver_root="/")
    assert cdi_problems(spec) == []
    broken = {**spec, "kind": "no-class"}
    assert cdi_problems(broken) != []  # the check can fail


def dra_claim(
    cfg: Config, inventory: Inventory, shared: SharedDevices, names: list[str], **consumed: int
) -> dict[str, Any]:
    p = plan(cfg, inventory, facts=READY)
    by_name = {d.name: d for d in dra_devices(p, inventory, shared=shared)}
    return claim_spec(
        driver="gpu.sharing-plugin.io",
        claim_uid="0b9c2f5e-1111-4222-8333-444455556666",
        devices=[by_name[n] for n in names],
        plan=p,
        flags=cfg.flags,
        consumed_mib=consumed,
        memory_hook_path="/usr/bin/nvidia-cdi-hook",
    )


def test_dra_claims_are_capped_at_what_they_consume() -> None:
    gpu0 = "gpu-00000000-0000-4000-8000-000000000000"
    inventory = r615(gpu(0))
    cfg = capped("best-effort")
    specs = [
        dra_claim(cfg, inventory, SharedDevices.CAPACITY, [gpu0], **{gpu0: mib})
        for mib in (10_240, 30_720)
    ]
    for spec, mib in zip(specs, (10_240, 30_720), strict=True):
        assert cdi_problems(spec) == []
        (device,) = spec["devices"]
        env = device["containerEdits"]["env"]
        assert f"NVIDIA_GPU_MEMORY_REQUEST={mib}" in env and f"NVIDIA_GPU_MEMORY_LIMIT={mib}" in env
        (hook,) = device["containerEdits"]["hooks"]
        assert hook["args"][-2:] == ["--gpu-id", gpu_uuid(0)]


def test_dra_replicas_are_capped_at_their_replica_share() -> None:
    names = [f"gpu-00000000-0000-4000-8000-000000000000-r{i}" for i in (0, 1)]
    spec = dra_claim(capped("required"), r615(gpu(0)), SharedDevices.REPLICAS, names)
    assert cdi_problems(spec) == []
    for device in spec["devices"]:
        assert f"NVIDIA_GPU_MEMORY_LIMIT={2 * 20_480}" in device["containerEdits"]["env"]


def test_dra_claims_of_uncapped_gpus_get_no_hook() -> None:
    gpu0 = "gpu-00000000-0000-4000-8000-000000000000"
    spec = dra_claim(capped("off"), r615(gpu(0)), SharedDevices.CAPACITY, [gpu0], **{gpu0: 1024})
    (device,) = spec["devices"]
    assert "hooks" not in device["containerEdits"]
    assert not any(e.startswith("NVIDIA_GPU_MEMORY") for e in device["containerEdits"]["env"])
