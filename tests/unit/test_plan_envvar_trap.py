"""The envvar trap: two of a node's resources whose device lists travel in one env var.

kubelet merges the Allocate answers of a container's resources by env var name, so a container
that requests two resources under `deviceListStrategy: envvar` keeps one NVIDIA_VISIBLE_DEVICES
and sees the GPUs of only one. How many resources a config advertises often depends on the node
(MIG profiles under migStrategy mixed, GPUs a selection leaves unshared, products a pattern
matches), so the plan warns with the names it advertises there; a config that names two
resources itself is warned about at load (validate), and the plan does not say it twice.
"""

from __future__ import annotations

from typing import Any

from plan_factory import T4, config, gpu, node, time_slicing

from sharing_plugin.config.advice import config_warnings
from sharing_plugin.plan import plan

TRAP = "flags.plugin.deviceListStrategy: envvar with"
MIXED = {"migStrategy": "mixed"}


def traps(warnings: tuple[str, ...] | list[str]) -> list[str]:
    return [w for w in warnings if w.startswith(TRAP)]


def with_strategy(strategy: Any, **flags: Any) -> dict[str, Any]:
    return {**flags, "plugin": {"deviceListStrategy": strategy}}


def test_mixed_mig_with_several_profiles_warns_with_the_names_on_this_node() -> None:
    inv = node(gpu(0, migs=("3g.40gb", "2g.20gb", "1g.10gb")), gpu(1))
    cfg = config(flags=MIXED)
    assert traps(config_warnings(cfg)) == []  # the config alone cannot know
    (warning,) = traps(plan(cfg, inv).warnings)
    assert warning.startswith(
        f"{TRAP} 4 resources (nvidia.com/gpu, nvidia.com/mig-1g.10gb, nvidia.com/mig-2g.20gb, "
        "nvidia.com/mig-3g.40gb): a container that requests two of them sees the GPUs of only "
        "one, because kubelet keeps one NVIDIA_VISIBLE_DEVICES per container; use "
        "deviceListStrategy volume-mounts, cdi-annotations or cdi-cri, or request one of these "
        "resources per container"
    )


def test_mixed_mig_with_one_profile_does_not_warn() -> None:
    inv = node(gpu(0, migs=("1g.10gb",) * 7), gpu(1, migs=("1g.10gb",) * 7))
    assert traps(plan(config(flags=MIXED), inv).warnings) == []


def test_a_selection_that_leaves_gpus_unshared_warns() -> None:
    cfg = time_slicing({"name": "gpu", "devices": [1], "replicas": 2}, renameByDefault=True)
    (warning,) = traps(plan(cfg, node(gpu(0), gpu(1))).warnings)
    assert "2 resources (nvidia.com/gpu, nvidia.com/gpu.shared)" in warning
    # on a node where the selection takes every GPU, only the shared name is advertised
    assert traps(plan(cfg, node(gpu(1))).warnings) == []


def test_a_pattern_that_matches_some_products_warns() -> None:
    cfg = config(resources={"gpus": [{"pattern": "Tesla*", "name": "t4"}]})
    (warning,) = traps(plan(cfg, node(gpu(0), gpu(1, product=T4))).warnings)
    assert "(nvidia.com/gpu, nvidia.com/t4)" in warning
    assert traps(plan(cfg, node(gpu(0, product=T4))).warnings) == []


def test_a_resource_with_no_device_does_not_count() -> None:
    # mig-1g.10gb is shared but absent from this node: nothing to request, nothing to merge.
    cfg = time_slicing({"name": "mig-1g.10gb", "replicas": 2})
    assert traps(plan(cfg, node(gpu(0))).warnings) == []


def test_what_the_config_already_said_is_not_repeated() -> None:
    shared = [{"name": "gpu", "replicas": 2}, {"name": "mig-1g.10gb", "replicas": 2}]
    cfg = config(flags=MIXED, sharing={"timeSlicing": {"resources": shared}})
    assert len(traps(config_warnings(cfg))) == 1
    inv = node(gpu(0, migs=("1g.10gb", "1g.10gb")), gpu(1))
    assert traps(plan(cfg, inv).warnings) == []


def test_strategies_that_carry_every_list_do_not_warn() -> None:
    inv = node(gpu(0, migs=("3g.40gb", "1g.10gb")), gpu(1))
    for strategy in ("volume-mounts", "cdi-cri", "cdi-annotations", ["envvar", "volume-mounts"]):
        cfg = config(flags=with_strategy(strategy, migStrategy="mixed"))
        assert traps(plan(cfg, inv).warnings) == [], strategy
    cfg = config(flags=with_strategy(["envvar"], migStrategy="mixed"))
    assert len(traps(plan(cfg, inv).warnings)) == 1
