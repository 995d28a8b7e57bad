"""The counters of a dynamic MIG GPU allow exactly the placement sets the MIG solver allows.

The allocator's rule for partitionable devices: a set of devices can be allocated together iff,
for every counter, what they consume in all is at most the counter's value. The MIG solver
(`place_layout` with every start fixed) says whether a set of placements can be created
together. Both families of sets are closed under taking subsets (every rule of either is a
bound that removing an instance cannot break), so they are equal iff every set the counters
allow is allowed by the solver, and every set the counters refuse *minimally* (every smaller set
allowed) is refused by the solver. The first test walks all of them for every
catalogued MIG model (a few thousand sets each); the property test then draws arbitrary sets,
needing no closure argument.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sharing_plugin.errors import MigError
from sharing_plugin.gpus.catalog import MODELS, GpuModel, MigModel, MigProfileSpec
from sharing_plugin.mig.solver import place_layout
from sharing_plugin.views.dra_mig import consumption, gpu_counters

MIG_MODELS = [m for m in MODELS if m.mig is not None]
Slot = tuple[MigProfileSpec, int]


def _mig(model: GpuModel) -> MigModel:
    assert model.mig is not None
    return model.mig


@cache
def slots(model: GpuModel) -> tuple[Slot, ...]:
    """Every placement of the model's table: one published device each."""
    return tuple((spec, start) for spec in _mig(model).profiles for start in spec.starts)


def counters_allow(model: GpuModel, chosen: Sequence[Slot]) -> bool:
    """The allocator's check: the consumed total of each counter within its value."""
    limits = gpu_counters(_mig(model))
    used: dict[str, int] = {}
    for spec, start in chosen:
        for counter, amount in consumption(spec, start).items():
            used[counter] = used.get(counter, 0) + amount
    return all(counter in limits and n <= limits[counter] for counter, n in used.items())


def solver_allows(model: GpuModel, chosen: Sequence[Slot]) -> bool:
    try:
        place_layout(model, [f"{spec.name}@{start}" for spec, start in chosen])
    except MigError:
        return False
    return True


def allowed_sets(model: GpuModel) -> list[tuple[int, ...]]:
    """Every set of placements the counters allow, as indexes into `slots`."""
    table = slots(model)
    found: list[tuple[int, ...]] = []

    def walk(first: int, chosen: tuple[int, ...]) -> None:
        found.append(chosen)
        for j in range(first, len(table)):
            more = (*chosen, j)
            if counters_allow(model, [table[i] for i in more]):
                walk(j + 1, more)

    walk(0, ())
    return found


@pytest.mark.exhaustive
@pytest.mark.parametrize("model", MIG_MODELS, ids=lambda m: m.display_name)
def test_the_counters_allow_exactly_what_the_solver_allows(model: GpuModel) -> None:
    table = slots(model)
    allowed = allowed_sets(model)
    assert len(allowed) > len(table)  # more than single placements: the walk went somewhere
    known = set(allowed)
    minimal: set[tuple[int, ...]] = set()
    for chosen in allowed:
        assert solver_allows(model, [table[i] for i in chosen]), chosen
        for j in range(len(table)):
            more = tuple(sorted((*chosen, j)))
            if j in chosen or more in known:
                continue
            # Refused by the counters; minimally so when every smaller set is allowed.
            if all(tuple(i for i in more if i != k) in known for k in more):
                minimal.add(more)
    assert minimal
    for refused in sorted(minimal):
        assert not solver_allows(model, [table[i] for i in refused]), refused


@pytest.mark.exhaustive
@pytest.mark.parametrize("model", MIG_MODELS, ids=lambda m: m.display_name)
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_any_set_of_placements_fits_the_counters_iff_it_fits_the_gpu(
    model: GpuModel, data: st.DataObject
) -> None:
    table = slots(model)
    chosen = data.draw(st.sets(st.sampled_from(range(len(table))), max_size=8))
    placed = [table[i] for i in sorted(chosen)]
    assert counters_allow(model, placed) == solver_allows(model, placed)


def test_a_3g_at_0_leaves_no_room_for_the_7g() -> None:
    """The case the real allocator is shown in tests/e2e (A100-80GB)."""
    model = next(m for m in MIG_MODELS if m.display_name == "A100-80GB")
    mig = _mig(model)
    three, seven, four = mig.profile("3g.40gb"), mig.profile("7g.80gb"), mig.profile("4g.40gb")
    assert three is not None and seven is not None and four is not None
    assert not counters_allow(model, [(three, 0), (seven, 0)])
    assert counters_allow(model, [(three, 4), (four, 0)])
    assert not counters_allow(model, [(three, 0), (four, 0)])


def test_the_counter_set_names_every_memory_slice_and_the_compute_slices() -> None:
    model = next(m for m in MIG_MODELS if m.display_name == "A30")
    counters = gpu_counters(_mig(model))
    assert counters == {
        "memory-slice-0": 1,
        "memory-slice-1": 1,
        "memory-slice-2": 1,
        "memory-slice-3": 1,
        "compute-slices": 4,
        "media-extensions": 1,
    }
