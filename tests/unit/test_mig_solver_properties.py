"""Properties of the MIG solver, checked against an independent enumeration of the catalog."""

from __future__ import annotations

from collections import Counter
from functools import cache
from itertools import product

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sharing_plugin.errors import MigError
from sharing_plugin.gpus.catalog import MODELS, GpuModel, MigModel
from sharing_plugin.gpus.inventory import MigPlacement
from sharing_plugin.mig import (
    MigCreate,
    MigInstance,
    MigPendingError,
    place_layout,
    plan_mig,
    validate_layout,
)

pytestmark = pytest.mark.exhaustive

MIG_MODELS = [m for m in MODELS if m.mig is not None]


def _mig(model: GpuModel) -> MigModel:
    assert model.mig is not None
    return model.mig


@cache
def _fitting_counts(model: GpuModel) -> frozenset[tuple[tuple[str, int], ...]]:
    """Every profile-count multiset some valid placement set realises (brute force, no solver)."""
    mig = _mig(model)
    slots = [(p, s) for p in mig.profiles for s in p.starts]
    found: set[tuple[tuple[str, int], ...]] = set()

    def walk(i: int, taken: int, counts: Counter[str]) -> None:
        found.add(tuple(sorted((n, c) for n, c in counts.items() if c)))
        for j in range(i, len(slots)):
            spec, start = slots[j]
            mask = ((1 << spec.size) - 1) << start
            if taken & mask or counts[spec.name] >= spec.max_count:
                continue
            if sum(counts.values()) >= mig.max_instances:
                continue
            me = sum(c for n, c in counts.items() if n.endswith("+me"))
            if spec.media_extensions and me >= 1:
                continue
            counts[spec.name] += 1
            walk(j + 1, taken | mask, counts)
            counts[spec.name] -= 1

    walk(0, 0, Counter())
    return frozenset(found)


def _assert_valid(model: GpuModel, layout: tuple[MigCreate, ...], kept: set[MigPlacement]) -> None:
    mig = _mig(model)
    counts = Counter(c.profile for c in layout)
    taken = 0
    for c in layout:
        spec = mig.profile(c.profile)
        assert spec is not None
        assert c.placement.size == spec.size
        assert c.placement.start in spec.starts or c.placement in kept
        mask = ((1 << spec.size) - 1) << c.placement.start
        assert not taken & mask, f"overlap at {c}"
        taken |= mask
        assert counts[c.profile] <= spec.max_count
    assert taken < (1 << mig.memory_slices)
    assert len(layout) <= mig.max_instances
    assert sum(n for p, n in counts.items() if p.endswith("+me")) <= 1
    assert sum(_spec_slices(mig, p) * n for p, n in counts.items()) <= mig.compute_slices


def _spec_slices(mig: MigModel, name: str) -> int:
    spec = mig.profile(name)
    assert spec is not None
    return spec.compute_slices


@pytest.mark.parametrize("model", MIG_MODELS, ids=[m.display_name for m in MIG_MODELS])
def test_validate_agrees_with_enumeration_on_every_count_vector(model: GpuModel) -> None:
    mig = _mig(model)
    fitting = _fitting_counts(model)
    ranges = [range(p.max_count + 1) for p in mig.profiles]
    for vector in product(*ranges):
        counts = {p.name: c for p, c in zip(mig.profiles, vector, strict=True) if c}
        key = tuple(sorted(counts.items()))
        try:
            validate_layout(model, counts)
            fits = True
        except MigError:
            fits = False
        assert fits == (key in fitting), counts


@st.composite
def _scenario(draw: st.DrawFn) -> tuple[GpuModel, list[MigInstance], dict[str, int], set[str]]:
    model = draw(st.sampled_from(MIG_MODELS))
    mig = _mig(model)
    # A current state built the way NVML allows: each instance at an allowed, free start.
    current: list[MigInstance] = []
    taken = 0
    for n in range(draw(st.integers(0, 7))):
        spec = draw(st.sampled_from(mig.profiles))
        start = draw(st.sampled_from(spec.starts))
        mask = ((1 << spec.size) - 1) << start
        counts = Counter(i.profile for i in current)
        me = sum(c for p, c in counts.items() if p.endswith("+me"))
        if taken & mask or counts[spec.name] >= spec.max_count or len(current) >= 7:
            continue
        if spec.media_extensions and me:
            continue
        taken |= mask
        current.append(MigInstance(f"MIG-{n}", spec.name, MigPlacement(start, spec.size)))
    desired = {
        p.name: draw(st.integers(0, min(p.max_count, 3)))
        for p in draw(st.permutations(mig.profiles))[:3]
    }
    held = {i.id for i in current if draw(st.booleans())}
    return model, current, desired, held


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_scenario())
def test_plans_are_valid_and_keep_held_instances(
    scenario: tuple[GpuModel, list[MigInstance], dict[str, int], set[str]],
) -> None:
    model, current, desired, held = scenario
    try:
        plan = plan_mig(model, current=current, desired=desired, held=held)
    except MigPendingError as pending:
        validate_layout(model, desired)  # pending means: it would fit without those pods
        assert pending.blocking
        assert {b.id for b in pending.blocking} <= held
        return
    except MigError:
        with pytest.raises(MigError):
            validate_layout(model, desired)
        return
    kept = {k.placement for k in plan.keep}
    _assert_valid(model, plan.layout, kept)
    assert Counter(c.profile for c in plan.layout) == Counter(
        {p: c for p, c in desired.items() if c}
    )
    by_id = {i.id: i for i in current}
    for h in held:
        assert by_id[h] in plan.keep
    assert sorted(i.id for i in plan.keep + plan.destroy) == sorted(by_id)
    assert not {d.id for d in plan.destroy} & held


@settings(max_examples=200, deadline=None)
@given(_scenario())
def test_planning_the_current_layout_changes_nothing(
    scenario: tuple[GpuModel, list[MigInstance], dict[str, int], set[str]],
) -> None:
    model, current, _, held = scenario
    desired = dict(Counter(i.profile for i in current))
    plan = plan_mig(model, current=current, desired=desired, held=held)
    assert not plan.changes
    assert len(plan.keep) == len(current)


@settings(max_examples=200, deadline=None)
@given(_scenario())
def test_plan_is_deterministic(
    scenario: tuple[GpuModel, list[MigInstance], dict[str, int], set[str]],
) -> None:
    model, current, desired, held = scenario
    try:
        first = plan_mig(model, current=current, desired=desired, held=held)
    except MigError as exc:
        with pytest.raises(type(exc)):
            plan_mig(model, current=list(reversed(current)), desired=desired, held=held)
        return
    again = plan_mig(model, current=list(reversed(current)), desired=desired, held=held)
    assert again.layout == first.layout


@settings(max_examples=150, deadline=None)
@given(_scenario())
def test_plan_keeps_as_many_instances_as_possible(
    scenario: tuple[GpuModel, list[MigInstance], dict[str, int], set[str]],
) -> None:
    model, current, desired, held = scenario
    try:
        plan = plan_mig(model, current=current, desired=desired, held=held)
    except MigError:
        return
    wanted = [p for p, c in desired.items() for _ in range(c)]
    best = 0
    for mask in range(1 << len(current)):
        chosen = [i for n, i in enumerate(current) if mask >> n & 1]
        if not {i.id for i in current if i.id in held} <= {i.id for i in chosen}:
            continue
        rest = list(wanted)
        try:
            for i in chosen:
                rest.remove(i.profile)
            place_layout(model, [f"{i.profile}@{i.placement.start}" for i in chosen] + rest)
        except (ValueError, MigError):
            continue
        best = max(best, len(chosen))
    assert len(plan.keep) == best
