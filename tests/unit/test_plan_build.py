"""plan(): MIG strategies, resource patterns, device facts, health and size limits."""

from __future__ import annotations

import pytest
from plan_factory import A100, T4, config, gpu, gpu_uuid, mig_uuid, node, time_slicing

from sharing_plugin.config.model import SharingKind
from sharing_plugin.errors import PlanError
from sharing_plugin.plan import DeviceHealth, plan
from sharing_plugin.plan.build import mig_capability_paths


def names(p: object) -> list[str]:
    return [r.name for r in p.resources]  # type: ignore[attr-defined]


def test_whole_gpus_under_nvidia_gpu_in_index_order() -> None:
    p = plan(config(), node(gpu(1), gpu(0)))
    (res,) = p.resources
    assert res.name == "nvidia.com/gpu"
    assert res.ids == (gpu_uuid(0), gpu_uuid(1))
    assert res.sharing is SharingKind.NONE
    d = res.devices[0]
    assert (d.physical, d.gpu_uuid, d.index, d.numa, d.paths) == (
        gpu_uuid(0),
        gpu_uuid(0),
        "0",
        0,
        ("/dev/nvidia0",),
    )
    assert d.health is DeviceHealth.HEALTHY
    assert p.warnings == ()


def test_strategy_none_advertises_mig_enabled_gpus_whole() -> None:
    p = plan(config(), node(gpu(0, migs=("1g.10gb", "1g.10gb"))))
    assert names(p) == ["nvidia.com/gpu"]
    assert p.resources[0].ids == (gpu_uuid(0),)


def test_strategy_single_advertises_mig_devices_as_gpu() -> None:
    inv = node(gpu(0, migs=("1g.10gb", "1g.10gb")), gpu(1, migs=("1g.10gb",)))
    p = plan(config(flags={"migStrategy": "single"}), inv)
    (res,) = p.resources
    assert res.name == "nvidia.com/gpu"
    assert res.ids == (mig_uuid(0, 0), mig_uuid(0, 1), mig_uuid(1, 0))
    d = res.devices[1]
    assert d.is_mig and d.index == "0:1" and d.gpu_uuid == gpu_uuid(0)
    assert d.paths == ("/dev/nvidia0", *mig_capability_paths(0, 2, 0))


def test_mig_capability_minors_follow_the_driver_numbering() -> None:
    assert mig_capability_paths(0, 0, 0) == (
        "/dev/nvidia-caps/nvidia-cap3",
        "/dev/nvidia-caps/nvidia-cap4",
    )
    assert mig_capability_paths(1, 0, 0)[0] == "/dev/nvidia-caps/nvidia-cap138"
    assert mig_capability_paths(0, 14, 7)[1] == "/dev/nvidia-caps/nvidia-cap137"


def test_single_rejects_mixed_profiles_and_mixed_modes_each_on_its_own() -> None:
    inv = node(
        gpu(0, migs=("1g.10gb",)),
        gpu(1, migs=("2g.20gb",)),
        gpu(2),
        gpu(3),
    )
    with pytest.raises(PlanError) as err:
        plan(config(flags={"migStrategy": "single"}), inv)
    problems = err.value.problems
    assert len(problems) == 3
    assert all(p.path == "flags.migStrategy" for p in problems)
    assert "one profile" in problems[0].message and "2g.20gb on GPU 1" in problems[0].message
    assert "GPU 2" in problems[1].message and "GPU 3" in problems[2].message


def test_mig_enabled_gpu_without_mig_devices_is_an_error_under_single() -> None:
    inv = node(gpu(0, mig_enabled=True), gpu(1, migs=("1g.10gb",)))
    with pytest.raises(PlanError) as err:
        plan(config(flags={"migStrategy": "single"}), inv)
    (problem,) = err.value.problems
    assert "GPU 0" in problem.message and "no MIG devices" in problem.message
    mixed = plan(config(flags={"migStrategy": "mixed"}), inv)
    assert names(mixed) == ["nvidia.com/mig-1g.10gb"]
    assert "GPU 0" in mixed.warnings[0] and "no MIG devices" in mixed.warnings[0]


def test_mig_enabled_gpu_without_devices_is_a_warning_when_a_layout_is_declared() -> None:
    cfg = config(
        flags={"migStrategy": "mixed"},
        partitioning={"mig": [{"devices": "all", "profiles": {"1g.10gb": 7}}]},
    )
    p = plan(cfg, node(gpu(0, mig_enabled=True)))
    assert p.resources == ()
    assert any("no MIG devices" in w for w in p.warnings)


def test_mixed_names_mig_resources_by_profile_with_plus_as_dot() -> None:
    inv = node(gpu(0, migs=("3g.40gb", "1g.10gb+me", "1g.10gb")), gpu(1, product=T4))
    p = plan(config(flags={"migStrategy": "mixed"}), inv)
    assert names(p) == [
        "nvidia.com/gpu",
        "nvidia.com/mig-1g.10gb",
        "nvidia.com/mig-1g.10gb.me",
        "nvidia.com/mig-3g.40gb",
    ]
    assert p.resource("nvidia.com/gpu").ids == (gpu_uuid(1),)  # type: ignore[union-attr]


def test_resource_patterns_rename_first_match_wins_anchored() -> None:
    cfg = config(
        resources={
            "gpus": [
                {"pattern": "Tesla*", "name": "tesla"},
                {"pattern": "*A100*", "name": "a100"},
                {"pattern": "*", "name": "other"},
            ]
        }
    )
    p = plan(cfg, node(gpu(0, product=A100), gpu(1, product=T4), gpu(2, product="X Tesla")))
    assert {r.name: r.ids for r in p.resources} == {
        "nvidia.com/a100": (gpu_uuid(0),),
        "nvidia.com/tesla": (gpu_uuid(1),),
        "nvidia.com/other": (gpu_uuid(2),),
    }


def test_mig_patterns_rename_profiles() -> None:
    cfg = config(
        flags={"migStrategy": "mixed"},
        resources={"mig": [{"pattern": "1g.*", "name": "mig-small"}]},
    )
    p = plan(cfg, node(gpu(0, migs=("1g.10gb", "1g.10gb+me", "3g.40gb"))))
    assert names(p) == ["nvidia.com/mig-3g.40gb", "nvidia.com/mig-small"]
    assert len(p.resource("nvidia.com/mig-small").devices) == 2  # type: ignore[union-attr]


def test_health_mapping_marks_a_gpu_and_everything_on_it() -> None:
    inv = node(gpu(0, migs=("1g.10gb", "1g.10gb")), gpu(1, migs=("1g.10gb",)))
    cfg = config(
        flags={"migStrategy": "single"},
        sharing={"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2}]}},
    )
    p = plan(cfg, inv, health={gpu_uuid(0): False, gpu_uuid(1): True})
    by_gpu = {(d.gpu_uuid, d.healthy) for d in p.resources[0].devices}
    assert by_gpu == {(gpu_uuid(0), False), (gpu_uuid(1), True)}
    p2 = plan(cfg, inv, health={mig_uuid(0, 1): False})
    unhealthy = [d.id for d in p2.resources[0].devices if not d.healthy]
    assert unhealthy == [f"{mig_uuid(0, 1)}::0", f"{mig_uuid(0, 1)}::1"]
    # Recovery: a new health mapping brings it back; discovery failures stay.
    assert p2.with_health({}).resources[0].healthy_count == 6


def test_gpu_unhealthy_at_discovery_stays_unhealthy() -> None:
    p = plan(config(), node(gpu(0, healthy=False), gpu(1)))
    assert [d.health for d in p.resources[0].devices] == [
        DeviceHealth.UNHEALTHY,
        DeviceHealth.HEALTHY,
    ]
    assert p.with_health({gpu_uuid(0): True}).resources[0].healthy_count == 1


def test_health_ignored_when_health_checks_are_disabled() -> None:
    p = plan(config(health={"enabled": False}), node(gpu(0)), health={gpu_uuid(0): False})
    assert p.resources[0].healthy_count == 1


def test_more_than_60000_devices_on_one_resource_is_an_error() -> None:
    inv = node(*(gpu(i) for i in range(2)))
    with pytest.raises(PlanError) as err:
        plan(time_slicing({"name": "gpu", "replicas": 30_001}), inv)
    (problem,) = err.value.problems
    assert problem.path == "sharing.timeSlicing.resources[0]"
    assert "60,002" in problem.message and "60,000" in problem.message
    assert (
        len(plan(time_slicing({"name": "gpu", "replicas": 30_000}), inv).resources[0].devices)
        == 60_000
    )


def test_entries_renamed_to_one_resource_count_together_against_the_limit() -> None:
    inv = node(*(gpu(i) for i in range(3)))
    cfg = time_slicing(
        {"name": "gpu", "devices": [0], "replicas": 30_000, "rename": "big"},
        {"name": "gpu", "devices": [1], "replicas": 30_001, "rename": "big"},
        {"name": "gpu", "devices": [2], "replicas": 60_000},
    )
    with pytest.raises(PlanError) as err:
        plan(cfg, inv)
    (problem,) = err.value.problems  # nvidia.com/gpu's 60,000 are fine
    assert problem.path == "sharing.timeSlicing.resources[0]"
    assert problem.message.startswith("nvidia.com/big would advertise 60,001 devices, over the")


def test_empty_node_advertises_nothing() -> None:
    assert plan(config(), node()).resources == ()
