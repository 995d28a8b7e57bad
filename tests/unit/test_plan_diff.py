"""The reload diff and draining, over plans built by the real plan() from configs."""

from __future__ import annotations

from plan_factory import config, gpu, gpu_uuid, mig_uuid, node, time_slicing

from sharing_plugin.plan import plan
from sharing_plugin.plan.diff import diff, draining_ids, with_draining

NODE = node(gpu(0), gpu(1))


def test_first_plan_starts_every_resource() -> None:
    new = plan(time_slicing({"name": "gpu", "replicas": 2}), NODE)
    d = diff(None, new)
    assert [r.name for r in d.start] == ["nvidia.com/gpu"]
    assert not d.stop and not d.push


def test_same_plan_changes_nothing() -> None:
    a = plan(time_slicing({"name": "gpu", "replicas": 2}), NODE)
    b = plan(time_slicing({"name": "gpu", "replicas": 2}), NODE)
    d = diff(a, b)
    assert d.empty and d.unchanged == ("nvidia.com/gpu",)
    assert d.describe() == "no change"


def test_replica_change_pushes_and_rename_starts_and_stops() -> None:
    a = plan(time_slicing({"name": "gpu", "replicas": 2}), NODE)
    more = plan(time_slicing({"name": "gpu", "replicas": 4}), NODE)
    assert [r.name for r in diff(a, more).push] == ["nvidia.com/gpu"]
    renamed = plan(time_slicing({"name": "gpu", "replicas": 2}, renameByDefault=True), NODE)
    d = diff(a, renamed)
    assert [r.name for r in d.start] == ["nvidia.com/gpu.shared"]
    assert d.stop == ("nvidia.com/gpu",)
    assert d.describe() == "+nvidia.com/gpu.shared -nvidia.com/gpu"


def test_held_replica_dropped_by_new_plan_stays_unhealthy() -> None:
    old = plan(time_slicing({"name": "gpu", "replicas": 4}), NODE)
    new = plan(time_slicing({"name": "gpu", "replicas": 2}), NODE)
    held_id = old.resources[0].ids[3]  # replica 3 of GPU 0: gone in the new plan
    assert held_id not in new.resources[0]
    drained = with_draining(new, old, {"nvidia.com/gpu": frozenset({held_id})})
    device = drained.resources[0].device(held_id)
    assert device is not None and not device.healthy
    assert draining_ids(drained, new) == {"nvidia.com/gpu": (held_id,)}
    # Once released, the same computation drops it.
    assert with_draining(new, drained, {}) == new


def test_removed_resource_with_held_device_keeps_only_that_device() -> None:
    old = plan(time_slicing({"name": "gpu", "replicas": 2}, renameByDefault=True), NODE)
    new = plan(config(), NODE)
    held_id = old.resources[0].ids[0]
    drained = with_draining(new, old, {"nvidia.com/gpu.shared": frozenset({held_id})})
    shared = drained.resource("nvidia.com/gpu.shared")
    assert shared is not None and shared.ids == (held_id,) and shared.healthy_count == 0
    assert drained.resource("nvidia.com/gpu") is not None


# -- issue 16: grants PodResources does not show yet, and the first plan after a restart --------

GPU = "nvidia.com/gpu"


def test_granted_device_not_yet_held_drains_even_when_the_old_plan_lacks_it() -> None:
    four = plan(time_slicing({"name": "gpu", "replicas": 4}), NODE)
    two = plan(time_slicing({"name": "gpu", "replicas": 2}), NODE)
    late = four.resources[0].devices[3]  # granted after `two` already withdrew it
    assert late.id not in two.resources[0]
    drained = with_draining(two, two, {}, granted={GPU: (late,)})
    device = drained.resources[0].device(late.id)
    assert device is not None and not device.healthy and device.physical == late.physical
    assert draining_ids(drained, two) == {GPU: (late.id,)}
    # A grant of a device the plan still advertises changes nothing.
    kept = two.resources[0].devices[0]
    assert with_draining(two, two, {}, granted={GPU: (kept,)}) == two


def test_first_plan_after_a_restart_keeps_held_replicas_draining() -> None:
    two = plan(time_slicing({"name": "gpu", "replicas": 2}), NODE)
    held = frozenset({f"{gpu_uuid(0)}::3", f"{gpu_uuid(1)}::2", f"{gpu_uuid(1)}::0"})
    drained = with_draining(two, None, {GPU: held})
    assert draining_ids(drained, two) == {GPU: (f"{gpu_uuid(0)}::3", f"{gpu_uuid(1)}::2")}
    rebuilt = drained.resources[0].device(f"{gpu_uuid(0)}::3")
    sibling = two.resources[0].device(f"{gpu_uuid(0)}::0")
    assert rebuilt is not None and sibling is not None
    assert (rebuilt.physical, rebuilt.numa, rebuilt.replica) == (gpu_uuid(0), sibling.numa, 3)
    assert not rebuilt.healthy


def test_first_plan_keeps_a_renamed_resource_held_on_a_device_of_the_node() -> None:
    migs = node(gpu(0, migs=("3g.40gb", "3g.40gb")), gpu(1, numa=1))
    whole = plan(config(), migs)
    held_mig = mig_uuid(0, 1)
    held = {
        "nvidia.com/mig-3g.40gb": frozenset({held_mig}),
        "nvidia.com/gpu.shared": frozenset({f"{gpu_uuid(1)}::5"}),
        "example.com/nic": frozenset({"nic-0"}),  # another plugin's
        "nvidia.com/other": frozenset({"GPU-not-on-this-node::1"}),
    }
    drained = with_draining(whole, None, held, node=migs)
    assert sorted(draining_ids(drained, whole)) == [
        "nvidia.com/gpu.shared",
        "nvidia.com/mig-3g.40gb",
    ]
    mig = drained.resource("nvidia.com/mig-3g.40gb")
    assert mig is not None and mig.ids == (held_mig,) and mig.healthy_count == 0
    device = mig.devices[0]
    assert (device.gpu_uuid, device.is_mig, device.index) == (gpu_uuid(0), True, "0:1")
    shared = drained.resource("nvidia.com/gpu.shared")
    assert shared is not None and shared.devices[0].numa == 1


def test_later_plans_leave_resources_that_were_never_ours_alone() -> None:
    two = plan(time_slicing({"name": "gpu", "replicas": 2}), NODE)
    held = {"nvidia.com/gpu.shared": frozenset({f"{gpu_uuid(0)}::0"})}
    assert with_draining(two, two, held, node=NODE) == two
