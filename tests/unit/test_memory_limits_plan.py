"""`memoryLimits` and `memoryPerReplica` for time-slicing: the config and the caps the plan gives.

A replica's cap is `memoryPerReplica` where given, else its GPU's memory over its replicas; MPS
clients are capped at their pinned memory limit; whole GPUs and MIG devices get none.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from plan_factory import config, gpu, gpu_uuid, mig_uuid, mps, node

from sharing_plugin.config.loader import parse_config
from sharing_plugin.config.memory import DEFAULT_HOOK_PATH, Enforcement, hook_path
from sharing_plugin.errors import ConfigError, PlanError
from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.plan import plan as plan_on
from sharing_plugin.plan.caps import NodeFacts
from sharing_plugin.plan.model import Plan

GIB = 1024


def plan(cfg: Any, inventory: Inventory) -> Plan:
    """The plan on a node that can enforce caps (R615, cgroup v2, the hook in place)."""
    ready = replace(inventory, driver_version="615.25.01")
    return plan_on(cfg, ready, facts=NodeFacts(cgroup_version=2, hook_problem=None))


def sliced(*resources: dict[str, Any], enforce: str = "best-effort", **sections: Any) -> Any:
    return config(
        memoryLimits={"enforce": enforce},
        sharing={"timeSlicing": {"resources": list(resources)}},
        **sections,
    )


def caps(p: Any, name: str = "nvidia.com/gpu") -> dict[str, set[int | None]]:
    found: dict[str, set[int | None]] = {}
    for d in p.resource(name).devices:
        found.setdefault(d.physical, set()).add(d.memory_cap_mib)
    return found


def problems_of(text: str) -> list[str]:
    with pytest.raises(ConfigError) as raised:
        parse_config(text, file="c.yaml")
    return [str(p) for p in raised.value.problems]


def test_off_by_default_and_no_caps() -> None:
    cfg = config(sharing={"timeSlicing": {"resources": [{"name": "gpu", "replicas": 4}]}})
    assert cfg.memory_limits.enforce is Enforcement.OFF
    assert caps(plan(cfg, node(gpu(0)))) == {gpu_uuid(0): {None}}


def test_unquoted_off_reads_as_off() -> None:
    loaded = parse_config("version: v1\nmemoryLimits:\n  enforce: off\n", file="c.yaml")
    assert loaded.config.memory_limits.enforce is Enforcement.OFF


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            "on",
            "c.yaml:3:12: memoryLimits.enforce: true names no mode: write one of off, "
            "best-effort, required",
        ),
        (
            "strict",
            "c.yaml:3:12: memoryLimits.enforce: 'strict' is not a mode: write one of "
            "off, best-effort, required",
        ),
    ],
)
def test_a_bad_mode_is_refused_at_its_line(value: str, message: str) -> None:
    assert problems_of(f"version: v1\nmemoryLimits:\n  enforce: {value}\n") == [message]


def test_hook_path_must_be_absolute() -> None:
    text = "version: v1\nmemoryLimits:\n  enforce: required\n  hookPath: bin/nvidia-cdi-hook\n"
    assert problems_of(text) == [
        "c.yaml:4:13: memoryLimits.hookPath: 'bin/nvidia-cdi-hook' is not an absolute path: "
        "write it from / as the plugin sees it"
    ]


def test_hook_path_default_is_the_environment_then_the_toolkit() -> None:
    limits = config(memoryLimits={"enforce": "required"}).memory_limits
    assert hook_path(limits, None) == DEFAULT_HOOK_PATH
    assert hook_path(limits, "/usr/local/nvidia/toolkit/nvidia-cdi-hook").startswith("/usr/local")
    own = config(memoryLimits={"enforce": "required", "hookPath": "/opt/hook"}).memory_limits
    assert hook_path(own, "/elsewhere") == "/opt/hook"


def test_memory_per_replica_sizes_time_slicing_and_is_the_cap() -> None:
    small = replace(gpu(0), memory_mib=40 * GIB)
    p = plan(sliced({"name": "gpu", "memoryPerReplica": "10Gi"}), node(small, gpu(1)))
    assert p.resource("nvidia.com/gpu").replicas_by_physical() == {gpu_uuid(0): 4, gpu_uuid(1): 8}
    assert caps(p) == {gpu_uuid(0): {10 * GIB}, gpu_uuid(1): {10 * GIB}}


def test_memory_per_replica_sizes_even_with_limits_off() -> None:
    p = plan(sliced({"name": "gpu", "memoryPerReplica": "20Gi"}, enforce="off"), node(gpu(0)))
    assert p.resource("nvidia.com/gpu").replicas_by_physical() == {gpu_uuid(0): 4}
    assert caps(p) == {gpu_uuid(0): {None}}


def test_replicas_split_the_gpu_memory_rounded_down() -> None:
    p = plan(sliced({"name": "gpu", "replicas": 3}), node(gpu(0)))
    assert caps(p) == {gpu_uuid(0): {81_920 // 3}}


def test_a_replica_larger_than_the_gpu_is_a_problem_at_its_entry() -> None:
    with pytest.raises(PlanError) as raised:
        plan(sliced({"name": "gpu", "memoryPerReplica": "100Gi"}), node(gpu(0), gpu(1)))
    messages = [(p.path, p.message) for p in raised.value.problems]
    # One report per size of device, not one per GPU.
    assert messages == [
        (
            "sharing.timeSlicing.resources[0].memoryPerReplica",
            f"GPU 0 ({gpu_uuid(0)}) has 80Gi: not one replica of this size fits; lower it",
        )
    ]


def test_mps_clients_are_capped_at_their_pinned_limit() -> None:
    cfg = mps({"name": "gpu", "replicas": 2, "pinnedMemoryLimit": "8Gi"})
    cfg = cfg.model_copy(
        update={"memory_limits": sliced({"name": "gpu", "replicas": 1}).memory_limits}
    )
    assert caps(plan(cfg, node(gpu(0)))) == {gpu_uuid(0): {8 * GIB}}


def test_whole_gpus_and_mig_devices_get_no_cap() -> None:
    inventory = node(gpu(0, migs=("3g.40gb",)), gpu(1))
    cfg = sliced(
        {"name": "mig-3g.40gb", "replicas": 2},
        flags={"migStrategy": "mixed"},
    )
    p = plan(cfg, inventory)
    assert caps(p, "nvidia.com/mig-3g.40gb") == {mig_uuid(0, 0): {None}}
    assert caps(p) == {gpu_uuid(1): {None}}  # not shared: nothing to cap


def test_mig_replicas_are_said_to_be_uncapped() -> None:
    text = (
        "version: v1\nflags: {migStrategy: mixed}\nmemoryLimits: {enforce: best-effort}\n"
        "sharing:\n  timeSlicing:\n    resources:\n    - name: mig-1g.10gb\n      replicas: 2\n"
    )
    warnings = parse_config(text, file="c.yaml").warnings
    assert any(
        "sharing.timeSlicing.resources[0]: memoryLimits cannot cap replicas of a MIG device" in w
        for w in warnings
    ), warnings


def test_mig_replicas_under_another_name_are_said_to_be_uncapped_by_the_plan() -> None:
    inventory = node(gpu(0, migs=("3g.40gb", "3g.40gb")))
    p = plan(sliced({"name": "gpu", "replicas": 2}, flags={"migStrategy": "single"}), inventory)
    assert [w for w in p.warnings if "cannot cap replicas of a MIG device" in w] == [
        "sharing.timeSlicing.resources[0]: memoryLimits cannot cap replicas of a MIG device (the "
        "driver caps memory on whole GPUs only): its replicas share the MIG device's memory "
        "uncapped"
    ]
