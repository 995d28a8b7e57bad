"""MIG placement solver (pure): desired profile counts + current instances -> a MigPlan.

Where mig-parted destroys every instance and retries creation orders until NVML stops failing,
this searches the catalog's placement table exhaustively before anything is touched (a GPU has
at most 8 memory slices and 7 instances, so backtracking over allowed starts is instant):

- instances that pods hold are pinned where they are; if the layout cannot be reached around
  them, the answer is `MigPendingError` naming the fewest held instances that are in the way;
- among the arrangements that fit, the one keeping the most existing instances wins (fewest
  destroys and creates); ties go to the first found with lower starts, so output is deterministic;
- a layout no arrangement allows raises `MigError` saying which rule it breaks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations

from sharing_plugin.errors import MigError
from sharing_plugin.gpus.catalog import GpuModel, MigModel, MigProfileSpec, resolve_profile
from sharing_plugin.gpus.inventory import MigPlacement
from sharing_plugin.mig.layout import MigCreate, MigInstance, MigPendingError, MigPlan

__all__ = ["place_layout", "plan_mig", "validate_layout"]


def validate_layout(model: GpuModel, profiles: Mapping[str, int]) -> None:
    """Raise MigError unless some arrangement of `profiles` ({name: count}) fits an empty GPU."""
    mig, wanted = _checked_counts(model, profiles)
    if _arrange(mig, wanted, pinned=(), keepable=()) is None:
        raise MigError(_no_arrangement(model, mig, wanted))


def place_layout(model: GpuModel, profiles: Sequence[str]) -> tuple[MigCreate, ...]:
    """Placements for a list of profiles on an empty GPU; ``"1g.10gb@6"`` fixes a start.

    This is how a described GPU state (e.g. a simulated node's ``instances``) gets concrete
    placements: fixed ones are honoured, the others go wherever the whole list fits.
    """
    fixed: list[MigInstance] = []
    counts: Counter[str] = Counter()
    for index, entry in enumerate(profiles):
        name, _, at = entry.partition("@")
        spec = resolve_profile(model, name)
        counts[spec.name] += 1
        if at:
            if not at.strip().isdigit():
                raise MigError(f"{entry!r}: the start after '@' must be a slice number")
            start = int(at)
            if start not in spec.starts:
                raise MigError(f"{entry!r}: {_starts_rule(spec)}")
            fixed.append(MigInstance(f"#{index}", spec.name, MigPlacement(start, spec.size)))
    mig, wanted = _checked_counts(model, counts)
    _check_disjoint(fixed)
    found = _arrange(mig, wanted, pinned=tuple(fixed), keepable=())
    if found is None:
        raise MigError(_no_arrangement(model, mig, wanted))
    return found.layout


def plan_mig(
    model: GpuModel,
    *,
    current: Sequence[MigInstance],
    desired: Mapping[str, int],
    held: Collection[str] = (),
) -> MigPlan:
    """The least disruptive way from `current` to `desired`, never touching a held instance.

    `held` holds the ids of current instances that pods use. Raises MigError when `desired`
    does not fit the model at all, MigPendingError when it fits only without some held instances.
    """
    mig, wanted = _checked_counts(model, desired)
    pinned = tuple(i for i in current if i.id in held)
    free = tuple(i for i in current if i.id not in held)
    _check_disjoint(current)
    found = _arrange(mig, wanted, pinned=pinned, keepable=free)
    if found is not None:
        return found
    if _arrange(mig, wanted, pinned=(), keepable=()) is None:
        raise MigError(_no_arrangement(model, mig, wanted))
    blocking = _fewest_blocking(mig, wanted, pinned)
    names = "; ".join(str(b) for b in blocking)
    raise MigPendingError(
        f"the layout {_describe(mig, wanted)} needs the place of instance(s) in use: {names}; "
        "waiting for the pods using them to end",
        blocking=blocking,
    )


def _checked_counts(model: GpuModel, profiles: Mapping[str, int]) -> tuple[MigModel, Counter[str]]:
    """Resolve names and check the per-profile, +me, instance and slice totals."""
    if model.mig is None:
        raise MigError(f"{model.display_name} does not support MIG")
    mig = model.mig
    wanted: Counter[str] = Counter()
    for name, count in profiles.items():
        spec = resolve_profile(model, name)
        if count < 0:
            raise MigError(f"{spec.name}: the count must be >= 0 (got {count})")
        if count:
            wanted[spec.name] += count
    for name, count in wanted.items():
        spec = _spec(mig, name)
        if count > spec.max_count:
            raise MigError(
                f"{count} x {name}: the {model.display_name} allows at most {spec.max_count} "
                f"({_starts_rule(spec)})"
            )
    with_me = sorted(n for n in wanted if _spec(mig, n).media_extensions)
    if sum(wanted[n] for n in with_me) > 1:
        raise MigError(
            f"{_describe(mig, Counter({n: wanted[n] for n in with_me}))}: the "
            f"{model.display_name} has one set of media extensions, so at most one '+me' "
            "instance can exist"
        )
    total = sum(wanted.values())
    if total > mig.max_instances:
        raise MigError(
            f"{_describe(mig, wanted)} is {total} instances: the {model.display_name} allows "
            f"at most {mig.max_instances}"
        )
    # No compute-slice total check: the placement table already allows no arrangement over
    # the compute slices (7 on 8 memory slices), and its message says more about why.
    memory = sum(_spec(mig, n).size * c for n, c in wanted.items())
    if memory > mig.memory_slices:
        raise MigError(
            f"{_describe(mig, wanted)} needs {memory} slices: the {model.display_name} has "
            f"{mig.memory_slices}"
        )
    return mig, wanted


@dataclass(slots=True)
class _Search:
    """Backtracking state: which profile slots remain, what is taken, the best so far."""

    order: list[MigProfileSpec]
    need: list[int]
    candidates: list[list[tuple[int, MigInstance | None]]]  # (start, current instance there)
    keep_cap: list[int]  # upper bound of keeps possible for each profile
    chosen: list[tuple[MigProfileSpec, int, MigInstance | None]]
    best: list[tuple[MigProfileSpec, int, MigInstance | None]] | None = None
    best_kept: int = -1

    def run(self, level: int, remaining: int, first: int, taken: int, kept: int) -> None:
        if self.best_kept == sum(self.keep_cap):
            return  # nothing can beat keeping every keepable instance
        if level == len(self.order):
            if kept > self.best_kept:
                self.best, self.best_kept = list(self.chosen), kept
            return
        if remaining == 0:
            nxt = level + 1
            self.run(nxt, self.need[nxt] if nxt < len(self.need) else 0, 0, taken, kept)
            return
        bound = kept + min(remaining, self.keep_cap[level]) + sum(self.keep_cap[level + 1 :])
        if bound <= self.best_kept:
            return
        spec = self.order[level]
        options = self.candidates[level]
        for index in range(first, len(options)):
            start, instance = options[index]
            mask = ((1 << spec.size) - 1) << start
            if taken & mask:
                continue
            self.chosen.append((spec, start, instance))
            gained = 1 if instance is not None else 0
            self.run(level, remaining - 1, index + 1, taken | mask, kept + gained)
            self.chosen.pop()


def _arrange(
    mig: MigModel,
    wanted: Counter[str],
    *,
    pinned: Sequence[MigInstance],
    keepable: Sequence[MigInstance],
) -> MigPlan | None:
    """The best plan with `pinned` kept in place, or None when no arrangement fits."""
    need = Counter(wanted)
    taken = 0
    for instance in pinned:
        if need[instance.profile] <= 0:
            return None  # the layout has no room for this instance's profile
        need[instance.profile] -= 1
        taken |= ((1 << instance.placement.size) - 1) << instance.placement.start
    # Big, tightly placed profiles first: they prune the search fastest.
    order = sorted(
        (_spec(mig, n) for n, c in need.items() if c > 0),
        key=lambda s: (-s.size, len(s.starts), s.name),
    )
    candidates: list[list[tuple[int, MigInstance | None]]] = []
    keep_cap: list[int] = []
    for spec in order:
        here = {
            k.placement.start: k
            for k in keepable
            if k.profile == spec.name and k.placement.size == spec.size
        }
        starts = sorted(set(spec.starts) | set(here))
        candidates.append([(s, here.get(s)) for s in starts])
        keep_cap.append(min(need[spec.name], len(here)))
    search = _Search(order, [need[s.name] for s in order], candidates, keep_cap, chosen=[])
    search.run(0, search.need[0] if order else 0, 0, taken, 0)
    if search.best is None:
        return None
    kept_ids = {i.id for _, _, i in search.best if i is not None}
    keep = list(pinned) + [k for k in keepable if k.id in kept_ids]
    destroy = [k for k in keepable if k.id not in kept_ids]
    create = [
        MigCreate(spec.name, MigPlacement(start, spec.size))
        for spec, start, instance in search.best
        if instance is None
    ]

    def by_start(item: MigInstance | MigCreate) -> tuple[int, str]:
        return item.placement.start, item.profile

    return MigPlan(
        keep=tuple(sorted(keep, key=by_start)),
        destroy=tuple(sorted(destroy, key=by_start)),
        create=tuple(sorted(create, key=by_start)),
    )


def _fewest_blocking(
    mig: MigModel, wanted: Counter[str], pinned: Sequence[MigInstance]
) -> tuple[MigInstance, ...]:
    """The smallest set of held instances whose release lets the layout fit."""
    ordered = sorted(pinned, key=lambda i: (i.placement.start, i.profile, i.id))
    for size in range(1, len(ordered) + 1):
        for gone in combinations(ordered, size):
            rest = tuple(i for i in ordered if i not in gone)
            if _arrange(mig, wanted, pinned=rest, keepable=()) is not None:
                return gone
    return tuple(ordered)


def _check_disjoint(instances: Sequence[MigInstance]) -> None:
    for a, b in combinations(instances, 2):
        if a.placement.overlaps(b.placement):
            raise MigError(f"instances overlap: {a} and {b}")


def _spec(mig: MigModel, name: str) -> MigProfileSpec:
    spec = mig.profile(name)
    if spec is None:  # names are resolved before they get here
        raise MigError(f"unknown MIG profile {name!r}")
    return spec


def _describe(mig: MigModel, wanted: Mapping[str, int]) -> str:
    """``4g.20gb + 2 x 2g.10gb``: biggest profiles first."""
    specs = sorted((_spec(mig, n) for n, c in wanted.items() if c), key=lambda s: (-s.size, s.name))
    parts = [s.name if wanted[s.name] == 1 else f"{wanted[s.name]} x {s.name}" for s in specs]
    return " + ".join(parts) or "no instances"


def _starts_rule(spec: MigProfileSpec) -> str:
    starts = [str(s) for s in spec.starts]
    if len(starts) == 1:
        return f"{spec.name} may start only at {starts[0]}"
    return f"{spec.name} may start only at {', '.join(starts[:-1])} or {starts[-1]}"


def _no_arrangement(model: GpuModel, mig: MigModel, wanted: Mapping[str, int]) -> str:
    memory = sum(_spec(mig, n).size * c for n, c in wanted.items())
    specs = sorted((_spec(mig, n) for n in wanted), key=lambda s: (-s.size, s.name))
    rules = "; ".join(_starts_rule(s) for s in specs)
    return (
        f"{_describe(mig, wanted)} needs {memory} slices in an arrangement the "
        f"{model.display_name} does not allow: {rules}"
    )
