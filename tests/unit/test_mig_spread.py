"""A node's MIG devices, counted per profile, spread over its GPUs: checked against an
enumeration of every per-GPU count vector the placement rules allow."""

from __future__ import annotations

import re
from collections import Counter
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_mig_solver_properties import MIG_MODELS, _assert_valid, _fitting_counts

from sharing_plugin.errors import MigError
from sharing_plugin.gpus.catalog import GpuModel, model_for
from sharing_plugin.mig import MigCreate, place_layout
from sharing_plugin.mig.spread import MOST_GPUS, spread_layouts

A100_80 = "NVIDIA A100-SXM4-80GB"
# mig-parted's all-balanced on an A100-80GB, as the solver places it on an empty GPU.
BALANCED = ["2g.20gb@0", "1g.10gb@2", "1g.10gb@3", "3g.40gb@4"]


def _model(product: str) -> GpuModel:
    model = model_for(product)
    assert model is not None
    return model


def _text(layout: tuple[MigCreate, ...]) -> list[str]:
    return [f"{c.profile}@{c.placement.start}" for c in layout]


def _total(layouts: tuple[tuple[MigCreate, ...], ...]) -> Counter[str]:
    return Counter(c.profile for layout in layouts for c in layout)


@cache
def _one_gpu(model: GpuModel) -> tuple[tuple[tuple[str, int], ...], ...]:
    """Every non-empty count vector one GPU can hold (brute force, no solver)."""
    return tuple(sorted(v for v in _fitting_counts(model) if v))


def _splittable(model: GpuModel, counts: Counter[str], gpus: int) -> bool:
    """Whether some `gpus` per-GPU vectors (empty ones allowed) add up to `counts`."""
    goal = tuple(sorted(counts.items()))
    reachable = {()}
    for _ in range(gpus):
        grown = set(reachable)
        for have in reachable:
            for vector in _one_gpu(model):
                total = Counter(dict(have)) + Counter(dict(vector))
                if all(total[p] <= counts[p] for p in total):
                    grown.add(tuple(sorted(total.items())))
        reachable = grown
    return goal in reachable


def test_mig_parteds_balanced_layout_on_two_gpus_comes_back_as_it_was() -> None:
    # Largest first onto the first GPU with room puts both 3g.40gb on one GPU, and the rest
    # (2 x 2g.20gb + 4 x 1g.10gb) needs 8 compute slices of 7: a greedy fitting refuses it.
    layouts = spread_layouts(_model(A100_80), {"3g.40gb": 2, "2g.20gb": 2, "1g.10gb": 4}, gpus=2)
    assert [_text(layout) for layout in layouts] == [BALANCED, BALANCED]


def test_counts_that_divide_evenly_give_every_gpu_the_same_layout() -> None:
    layouts = spread_layouts(_model(A100_80), {"3g.40gb": 8, "2g.20gb": 8, "1g.10gb": 16}, gpus=8)
    assert [_text(layout) for layout in layouts] == [BALANCED] * 8


def test_as_few_gpus_as_hold_the_devices() -> None:
    layouts = spread_layouts(_model(A100_80), {"1g.10gb": 8, "7g.80gb": 1}, gpus=4)
    assert sorted(len(layout) for layout in layouts) == [1, 1, 7]
    assert _total(layouts) == Counter({"1g.10gb": 8, "7g.80gb": 1})
    assert spread_layouts(_model(A100_80), {}, gpus=4) == ()
    assert spread_layouts(_model(A100_80), {"1g.10gb": 0}, gpus=None) == ()


def test_without_a_gpu_count_as_many_gpus_as_it_takes() -> None:
    layouts = spread_layouts(_model(A100_80), {"3g.40gb": 5}, gpus=None)
    assert [len(layout) for layout in layouts] == [2, 2, 1]


@pytest.mark.parametrize(
    ("counts", "gpus", "message"),
    [
        ({"1g.10gb": 15}, 2, "15 MIG devices (15 x 1g.10gb) do not fit 2 GPU(s) of the A100-80GB"),
        ({"2g.20gb": 2, "1g.10gb": 4}, 1, "do not fit 1 GPU(s)"),
        ({"1g.10gb": 1}, 0, "do not fit 0 GPU(s)"),
        ({"1g.10gb": 7 * MOST_GPUS + 1}, None, f"do not fit {MOST_GPUS} GPUs"),
    ],
)
def test_counts_no_split_holds_are_refused(
    counts: dict[str, int], gpus: int | None, message: str
) -> None:
    with pytest.raises(MigError, match=re.escape(message)):
        spread_layouts(_model(A100_80), counts, gpus=gpus)


def test_profiles_are_resolved_and_checked_against_the_model() -> None:
    layouts = spread_layouts(_model(A100_80), {" 1g.10gb+me": 1}, gpus=1)
    assert _total(layouts) == Counter({"1g.10gb+me": 1})
    with pytest.raises(MigError, match=re.escape("unknown MIG profile '1g.5gb'")):
        spread_layouts(_model(A100_80), {"1g.5gb": 1}, gpus=1)
    with pytest.raises(MigError, match="does not support MIG"):
        spread_layouts(_model("Tesla T4"), {"1g.5gb": 1}, gpus=1)


@st.composite
def _node(draw: st.DrawFn) -> tuple[GpuModel, list[tuple[tuple[str, int], ...]]]:
    """A MIG model and, per GPU of a node, a count vector one GPU holds."""
    model = draw(st.sampled_from(MIG_MODELS))
    gpus = draw(st.lists(st.sampled_from(_one_gpu(model)), min_size=1, max_size=8))
    return model, gpus


@pytest.mark.exhaustive
@settings(max_examples=150, deadline=None)
@given(_node())
def test_devices_a_node_holds_are_spread_onto_the_fewest_gpus_each_placed_by_the_solver(
    node: tuple[GpuModel, list[tuple[tuple[str, int], ...]]],
) -> None:
    model, per_gpu = node
    counts = sum((Counter(dict(v)) for v in per_gpu), Counter[str]())
    layouts = spread_layouts(model, counts, gpus=len(per_gpu))
    assert 1 <= len(layouts) <= len(per_gpu)
    assert _total(layouts) == counts
    for layout in layouts:
        _assert_valid(model, layout, kept=set())
        assert layout == place_layout(model, [c.profile for c in layout])
    if len(layouts) > 1:
        with pytest.raises(MigError):
            spread_layouts(model, counts, gpus=len(layouts) - 1)


@st.composite
def _counts(draw: st.DrawFn) -> tuple[GpuModel, Counter[str], int]:
    """Any small counts of a model's profiles, over one to three GPUs."""
    model = draw(st.sampled_from(MIG_MODELS))
    assert model.mig is not None
    names = draw(st.lists(st.sampled_from(model.mig.profile_names), min_size=1, max_size=3))
    counts = Counter({n: draw(st.integers(1, 5)) for n in names})
    return model, counts, draw(st.integers(1, 3))


@pytest.mark.exhaustive
@settings(max_examples=150, deadline=None)
@given(_counts())
def test_a_split_is_found_exactly_when_one_exists(
    case: tuple[GpuModel, Counter[str], int],
) -> None:
    model, counts, gpus = case
    try:
        layouts = spread_layouts(model, counts, gpus=gpus)
    except MigError:
        assert not _splittable(model, counts, gpus)
        return
    assert _splittable(model, counts, gpus)
    assert _total(layouts) == counts and len(layouts) <= gpus
