"""The MIG solver over the catalog: which layouts fit, why others do not, and incremental plans."""

from __future__ import annotations

import pytest

from sharing_plugin.errors import MigError
from sharing_plugin.gpus.catalog import GpuModel, model_for
from sharing_plugin.gpus.inventory import MigPlacement
from sharing_plugin.mig import (
    MigCreate,
    MigInstance,
    MigPendingError,
    place_layout,
    plan_mig,
    validate_layout,
)

A100_40 = "NVIDIA A100-SXM4-40GB"
A100_80 = "NVIDIA A100-SXM4-80GB"
A30 = "NVIDIA A30"
H100 = "NVIDIA H100 80GB HBM3"
H200 = "NVIDIA H200"

ARRANGEMENT = "in an arrangement the"


def _model(product: str) -> GpuModel:
    model = model_for(product)
    assert model is not None
    return model


def _layout(text: str) -> dict[str, int]:
    """``"4g.20gb + 2 x 2g.10gb"`` -> {"4g.20gb": 1, "2g.10gb": 2}."""
    counts: dict[str, int] = {}
    for part in text.split("+ "):
        count, _, name = part.strip().rpartition(" x ")
        counts[name] = counts.get(name, 0) + (int(count) if count else 1)
    return counts


def _inst(id_: str, profile: str, start: int, size: int) -> MigInstance:
    return MigInstance(id_, profile, MigPlacement(start, size))


@pytest.mark.parametrize(
    ("product", "layout", "error"),
    [
        # A100-40GB: 7 compute slices over 8 memory slices.
        (A100_40, "7g.40gb", None),
        (A100_40, "4g.20gb + 3g.20gb", None),
        (
            A100_40,
            "4g.20gb + 2 x 2g.10gb",
            "4g.20gb + 2 x 2g.10gb needs 8 slices in an arrangement the A100-40GB does not "
            "allow: 4g.20gb may start only at 0; 2g.10gb may start only at 0, 2 or 4",
        ),
        (A100_40, "3 x 2g.10gb + 1g.10gb", None),
        (A100_40, "3 x 2g.10gb + 1g.5gb", None),
        (A100_40, "3 x 2g.10gb + 2 x 1g.5gb", "1g.5gb may start only at 0, 1, 2, 3, 4, 5 or 6"),
        (A100_40, "2 x 3g.20gb", None),
        (A100_40, "3g.20gb + 4 x 1g.5gb", None),
        (A100_40, "3g.20gb + 2 x 2g.10gb", None),
        (A100_40, "3g.20gb + 2g.10gb + 2 x 1g.5gb", None),
        (
            A100_40,
            "3 x 3g.20gb",
            "3 x 3g.20gb: the A100-40GB allows at most 2 (3g.20gb may start only at 0 or 4)",
        ),
        (A100_40, "8 x 1g.5gb", "allows at most 7"),
        (A100_40, "2 x 1g.5gb+me", "allows at most 1"),
        (A100_40, "1g.5gb+me + 6 x 1g.5gb", None),
        (A100_40, "1g.5gb+me + 7 x 1g.5gb", "is 8 instances: the A100-40GB allows at most 7"),
        (A100_40, "4 x 1g.10gb", None),
        (A100_40, "4 x 1g.10gb + 1g.5gb", "needs 9 slices: the A100-40GB has 8"),
        (
            A100_40,
            "1g.20gb",
            "unknown MIG profile '1g.20gb' for A100-40GB: its profiles are 1g.5gb",
        ),
        (A100_40, "4g.20gb + 3 x 1g.5gb", None),
        (A100_40, "7g.40gb + 1g.5gb", "needs 9 slices"),
        (A100_40, "2g.10gb + 3 x 1g.10gb", None),
        (A100_40, "4g.20gb + 2g.10gb + 1g.10gb", None),
        (A100_40, "4g.20gb + 1g.10gb + 2 x 1g.5gb", None),
        (A100_40, "2 x 1g.10gb + 3 x 2g.10gb", "needs 10 slices"),
        # A100-80GB: the same geometry, other names (1g.10gb is one memory slice here).
        (A100_80, "7 x 1g.10gb", None),
        (A100_80, "4 x 1g.20gb", None),
        (A100_80, "1g.5gb", "unknown MIG profile '1g.5gb' for A100-80GB"),
        (A100_80, "3g.40gb + 2g.20gb + 2 x 1g.10gb", None),
        (A100_80, "4g.40gb + 2 x 2g.20gb", ARRANGEMENT),
        # A30: 4 slices, one media-extension instance between 1g.6gb+me and 2g.12gb+me.
        (A30, "4 x 1g.6gb", None),
        (A30, "2 x 2g.12gb", None),
        (A30, "1g.6gb+me + 2g.12gb+me", "at most one '+me' instance"),
        (A30, "2g.12gb + 2 x 1g.6gb", None),
        (A30, "2g.12gb+me + 2g.12gb", None),
        (A30, "4g.24gb + 1g.6gb", "needs 5 slices: the A30 has 4"),
        (A30, "3 x 2g.12gb", "allows at most 2"),
        # Hopper.
        (H100, "1g.10gb+me + 3 x 2g.20gb", None),
        (H100, "3g.40gb + 4g.40gb", None),
        (H200, "3g.71gb + 4g.71gb", None),
        (H200, "7g.141gb + 1g.18gb", "needs 9 slices: the H200 has 8"),
        (H200, "4 x 1g.35gb", None),
        (
            H200,
            "4g.71gb + 2 x 2g.35gb",
            "2g.35gb may start only at 0, 2 or 4",
        ),
        (H200, "1g.10gb", "its profiles are 1g.18gb, 1g.18gb+me, 1g.35gb"),
        ("Tesla T4", "1g.5gb", "T4 does not support MIG"),
    ],
)
def test_validate_layout(product: str, layout: str, error: str | None) -> None:
    model = _model(product)
    if error is None:
        validate_layout(model, _layout(layout))
        placed = place_layout(model, [n for n, c in _layout(layout).items() for _ in range(c)])
        assert sorted(c.profile for c in placed) == sorted(
            n for n, c in _layout(layout).items() for _ in range(c)
        )
    else:
        with pytest.raises(MigError) as caught:
            validate_layout(model, _layout(layout))
        assert error in str(caught.value)


def test_negative_and_zero_counts() -> None:
    model = _model(A100_40)
    validate_layout(model, {"7g.40gb": 1, "1g.5gb": 0})
    with pytest.raises(MigError, match=r"1g.5gb: the count must be >= 0 \(got -1\)"):
        validate_layout(model, {"1g.5gb": -1})


def test_place_layout_honours_fixed_starts() -> None:
    model = _model(A100_40)
    placed = place_layout(model, ["3g.20gb", "1g.10gb@0", "1g.5gb"])
    assert [(c.profile, c.placement.start) for c in placed] == [
        ("1g.10gb", 0),
        ("1g.5gb", 2),
        ("3g.20gb", 4),
    ]
    with pytest.raises(MigError, match=r"'3g\.20gb@2': 3g\.20gb may start only at 0 or 4"):
        place_layout(model, ["3g.20gb@2"])
    with pytest.raises(MigError, match="instances overlap"):
        place_layout(model, ["3g.20gb@0", "1g.5gb@3"])
    with pytest.raises(MigError, match=ARRANGEMENT):
        place_layout(model, ["4g.20gb@0", "1g.10gb@4", "2g.10gb"])


def test_plan_without_changes_keeps_everything() -> None:
    model = _model(A100_40)
    current = [_inst("a", "3g.20gb", 0, 4), _inst("b", "2g.10gb", 4, 2), _inst("c", "1g.5gb", 6, 1)]
    plan = plan_mig(model, current=current, desired=_layout("3g.20gb + 2g.10gb + 1g.5gb"))
    assert not plan.changes
    assert plan.keep == tuple(current)


def test_plan_adds_next_to_kept_instance() -> None:
    model = _model(A100_40)
    plan = plan_mig(
        model, current=[_inst("a", "4g.20gb", 0, 4)], desired=_layout("4g.20gb + 3g.20gb")
    )
    assert [k.id for k in plan.keep] == ["a"]
    assert plan.destroy == ()
    assert plan.create == (MigCreate("3g.20gb", MigPlacement(4, 4)),)


def test_plan_keeps_the_instance_that_leaves_room() -> None:
    # Keeping the 3g at 0 leaves only starts 4-6 for four 1g: the one at 4 must stay instead.
    model = _model(A100_40)
    current = [_inst("low", "3g.20gb", 0, 4), _inst("high", "3g.20gb", 4, 4)]
    plan = plan_mig(model, current=current, desired=_layout("3g.20gb + 4 x 1g.5gb"))
    assert [k.id for k in plan.keep] == ["high"]
    assert [d.id for d in plan.destroy] == ["low"]
    assert [c.placement.start for c in plan.create] == [0, 1, 2, 3]
    assert plan.describe()[0] == "destroy 3g.20gb at slices 0-3 (low)"


def test_plan_rearranges_when_nothing_can_stay() -> None:
    # 3g+2g+1g kept in place leave slice 7, where no 1g may start: all must move.
    model = _model(A100_40)
    current = [_inst("a", "3g.20gb", 0, 4), _inst("b", "2g.10gb", 4, 2), _inst("c", "1g.5gb", 6, 1)]
    plan = plan_mig(model, current=current, desired=_layout("3g.20gb + 2g.10gb + 2 x 1g.5gb"))
    assert plan.keep == ()
    assert len(plan.destroy) == 3
    assert [(c.profile, c.placement.start) for c in plan.layout] == [
        ("2g.10gb", 0),
        ("1g.5gb", 2),
        ("1g.5gb", 3),
        ("3g.20gb", 4),
    ]


def test_plan_with_held_instance_pinned() -> None:
    model = _model(A100_40)
    current = [_inst("h", "1g.5gb", 0, 1), _inst("f", "1g.5gb", 1, 1), _inst("x", "2g.10gb", 2, 2)]
    plan = plan_mig(model, current=current, desired=_layout("3g.20gb + 2 x 1g.5gb"), held={"h"})
    assert [k.id for k in plan.keep] == ["h", "f"]
    assert [d.id for d in plan.destroy] == ["x"]
    assert plan.create == (MigCreate("3g.20gb", MigPlacement(4, 4)),)


def test_plan_shrinking_keeps_held_and_lowest() -> None:
    model = _model(A100_80)
    current = [_inst(f"g{i}", "1g.10gb", i, 1) for i in range(7)]
    plan = plan_mig(model, current=current, desired={"1g.10gb": 3}, held={"g5"})
    assert [k.id for k in plan.keep] == ["g0", "g1", "g5"]
    assert [d.id for d in plan.destroy] == ["g2", "g3", "g4", "g6"]
    assert plan.create == ()


def test_held_instance_in_the_way_is_pending() -> None:
    model = _model(A100_40)
    current = [_inst("low", "3g.20gb", 0, 4), _inst("high", "3g.20gb", 4, 4)]
    with pytest.raises(MigPendingError, match=r"3g.20gb at slices 0-3 \(low\)") as caught:
        plan_mig(model, current=current, desired=_layout("3g.20gb + 4 x 1g.5gb"), held={"low"})
    assert [b.id for b in caught.value.blocking] == ["low"]


def test_held_instance_of_a_removed_profile_is_pending() -> None:
    model = _model(A30)
    current = [_inst("MIG-held", "2g.12gb", 0, 2), _inst("MIG-free", "2g.12gb", 2, 2)]
    with pytest.raises(MigPendingError) as caught:
        plan_mig(model, current=current, desired={"4g.24gb": 1}, held={"MIG-held"})
    assert [b.id for b in caught.value.blocking] == ["MIG-held"]
    assert "waiting for the pods using them to end" in str(caught.value)


def test_only_the_fewest_held_instances_are_named() -> None:
    model = _model(A100_40)
    current = [_inst(f"g{i}", "1g.5gb", i, 1) for i in range(7)]
    with pytest.raises(MigPendingError) as caught:
        plan_mig(
            model,
            current=current,
            desired=_layout("3g.20gb + 4 x 1g.5gb"),
            held={"g0", "g1", "g4"},
        )
    # 3g must go at 0 or 4: releasing g4 alone lets it sit at 4 with g0..g3 kept.
    assert [b.id for b in caught.value.blocking] == ["g4"]


def test_impossible_layout_is_an_error_not_pending() -> None:
    model = _model(A100_40)
    current = [_inst("a", "7g.40gb", 0, 8)]
    with pytest.raises(MigError, match=ARRANGEMENT) as caught:
        plan_mig(model, current=current, desired=_layout("4g.20gb + 2 x 2g.10gb"), held={"a"})
    assert not isinstance(caught.value, MigPendingError)


def test_profile_names_resolve_per_model_in_plans() -> None:
    plan = plan_mig(_model(A100_80), current=[], desired={"1g.10gb": 7})
    assert len(plan.create) == 7
    with pytest.raises(MigError, match="allows at most 4"):
        plan_mig(_model(A100_40), current=[], desired={"1g.10gb": 7})
