"""A node's MIG devices, counted per profile, spread over its GPUs so that each GPU's share fits.

GPU labels count a node's MIG devices per profile (`nvidia.com/mig-3g.40gb.count: 2`), never per
GPU, so planning a node from its labels first has to split the counts into per-GPU layouts the
model's placement rules allow. Splitting is a search, not a fitting: a greedy pass (largest
first, onto the first GPU with room) refuses counts that a real node holds, e.g. two A100-80GB
in mig-parted's balanced layout (3g.40gb + 2g.20gb + 2 x 1g.10gb each) look like 2 x 3g.40gb
on one GPU, leaving 2 x 2g.20gb + 4 x 1g.10gb for the other, which needs 8 compute slices of 7.

Every per-GPU share is judged by the placement solver, and placed by it, as a layout declared
in `partitioning.mig` for an empty GPU is, so a split found here is one the node could have:

- as few GPUs as hold the devices (the others have no MIG device);
- among those, every GPU with the same layout when the counts divide evenly and that layout
  fits (mig-parted's `all-*` configurations, the common case), else the first split of a
  complete, deterministic search, GPUs ordered from the fullest share;
- no split fits: `MigError`.

The search stays small: the shares are the count vectors the solver accepts (a few hundred at
most); GPUs are interchangeable, so each step only fills the GPU that holds a device of the
largest profile left (some GPU must); a remainder that needs more GPUs than are left (by
memory slices, compute slices, instances, media extensions or a profile's own limit) is cut at
once; and a remainder that failed with n GPUs is not tried again with n or fewer.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache

from sharing_plugin.errors import MigError
from sharing_plugin.gpus.catalog import GpuModel, MigModel, MigProfileSpec, resolve_profile
from sharing_plugin.mig.layout import MigCreate
from sharing_plugin.mig.solver import place_layout, validate_layout

__all__ = ["MOST_GPUS", "spread_layouts"]

Counts = tuple[int, ...]
"""Devices per profile, in the order of `_Profiles.specs` (the largest profiles first)."""

MOST_GPUS = 64
"""The most GPUs one node's devices are spread over: labels asking for more describe no node
(each GPU is one level of the search, so this also bounds its depth)."""


def spread_layouts(
    model: GpuModel, counts: Mapping[str, int], *, gpus: int | None
) -> tuple[tuple[MigCreate, ...], ...]:
    """Per GPU used, the placements of its share of `counts` ({profile: devices}).

    At most `gpus` GPUs (None: as many as it takes, up to `MOST_GPUS`); fewer come back when
    fewer hold the devices, none for no devices. Raises MigError when a profile is not the
    model's or no split over that many GPUs fits.
    """
    if model.mig is None:
        raise MigError(f"{model.display_name} does not support MIG")
    wanted: dict[str, int] = {}
    for name, count in counts.items():
        spec = resolve_profile(model, name)
        if count < 0:
            raise MigError(f"{spec.name}: the count must be >= 0 (got {count})")
        if count:
            wanted[spec.name] = wanted.get(spec.name, 0) + count
    if not wanted:
        return ()
    names = tuple(sorted(wanted, key=lambda n: (-_spec(model.mig, n).memory_slices, n)))
    vector = tuple(wanted[n] for n in names)
    most = MOST_GPUS if gpus is None else min(gpus, MOST_GPUS)
    shares = _split(model, names, vector, most)
    if shares is None:
        where = f"{MOST_GPUS} GPUs" if gpus is None else f"{gpus} GPU(s)"
        raise MigError(
            f"{sum(vector)} MIG devices ({_describe(names, vector)}) do not fit {where} of the "
            f"{model.display_name} as its placement rules allow"
        )
    return tuple(_placed(model, names, share) for share in shares)


@lru_cache(maxsize=1024)
def _split(
    model: GpuModel, names: tuple[str, ...], counts: Counts, gpus: int
) -> tuple[Counts, ...] | None:
    """Per GPU, its share of `counts`, on as few of `gpus` GPUs as hold them; None when none do.

    Cached: the fleet view asks the same question for every node of one kind.
    """
    assert model.mig is not None
    profiles = _Profiles(model.mig, names)
    most = tuple(min(n, s.max_count) for n, s in zip(counts, profiles.specs, strict=True))
    search = _Search(profiles, _shares(model, names, most))
    # Each GPU holds at least one device, so more GPUs than devices never help.
    for used in range(profiles.gpus_needed(counts), min(gpus, sum(counts)) + 1):
        even = _even(model, names, counts, used)
        if even is not None:
            return (even,) * used
        found = search.run(counts, used)
        if found is not None:
            return tuple(sorted(found, key=search.rank.__getitem__))
    return None


def _even(model: GpuModel, names: tuple[str, ...], counts: Counts, used: int) -> Counts | None:
    """One share for each of `used` GPUs, when the counts divide evenly and that share fits."""
    if any(c % used for c in counts):
        return None
    share = tuple(c // used for c in counts)
    return share if _fits(model, names, share) else None


@lru_cache(maxsize=1024)
def _shares(model: GpuModel, names: tuple[str, ...], most: Counts) -> tuple[Counts, ...]:
    """Every non-empty share of at most `most` devices per profile that one GPU holds: the most
    memory slices first, then the larger profiles first, so the search tries full GPUs before
    half-empty ones. Cached: nodes of one model ask with the same few bounds."""
    mig = model.mig
    assert mig is not None
    specs = [_spec(mig, n) for n in names]
    found: list[Counts] = []

    def extend(prefix: list[int], slices: int, instances: int) -> None:
        i = len(prefix)
        if i == len(specs):
            if instances and _fits(model, names, tuple(prefix)):
                found.append(tuple(prefix))
            return
        spec = specs[i]
        for n in range(most[i] + 1):
            more = slices + n * spec.memory_slices
            if more > mig.memory_slices or instances + n > mig.max_instances:
                break  # cheap bounds first: the solver is asked only what could fit
            extend([*prefix, n], more, instances + n)

    extend([], 0, 0)

    def order(share: Counts) -> tuple[int, ...]:
        slices = sum(n * s.memory_slices for n, s in zip(share, specs, strict=True))
        return (-slices, *(-n for n in share))

    return tuple(sorted(found, key=order))


@lru_cache(maxsize=8192)
def _fits(model: GpuModel, names: tuple[str, ...], share: Counts) -> bool:
    try:
        validate_layout(model, dict(zip(names, share, strict=True)))
    except MigError:
        return False
    return True


@lru_cache(maxsize=4096)
def _placed(model: GpuModel, names: tuple[str, ...], share: Counts) -> tuple[MigCreate, ...]:
    """The solver's placements of one GPU's share, as for a layout declared on an empty GPU."""
    return place_layout(model, [n for n, c in zip(names, share, strict=True) for _ in range(c)])


class _Profiles:
    """The profiles being split, with what bounds the GPUs a remainder needs."""

    def __init__(self, mig: MigModel, names: tuple[str, ...]) -> None:
        self.mig = mig
        self.specs = tuple(_spec(mig, n) for n in names)

    def gpus_needed(self, counts: Counts) -> int:
        """A lower bound on the GPUs `counts` needs: each GPU has so many memory and compute
        slices, instances and one set of media extensions, and holds so many of a profile."""
        mig = self.mig
        memory = compute = media = 0
        bound = -(-sum(counts) // mig.max_instances)
        for n, spec in zip(counts, self.specs, strict=True):
            memory += n * spec.memory_slices
            compute += n * spec.compute_slices
            media += n if spec.media_extensions else 0
            bound = max(bound, -(-n // spec.max_count))
        return max(bound, -(-memory // mig.memory_slices), -(-compute // mig.compute_slices), media)


class _Search:
    """Depth first over GPUs. Each step fills the GPU that holds a device of the first (largest)
    profile left, trying only the shares that include one: every split has such a GPU, and
    which GPU is which does not matter."""

    def __init__(self, profiles: _Profiles, shares: tuple[Counts, ...]) -> None:
        self.profiles = profiles
        self.rank = {share: i for i, share in enumerate(shares)}
        width = len(profiles.specs)
        self.holding = [tuple(s for s in shares if s[i]) for i in range(width)]
        self.failed: dict[Counts, int] = {}  # remainder -> most GPUs it did not fit

    def run(self, counts: Counts, gpus: int) -> tuple[Counts, ...] | None:
        return self._fill(counts, gpus)

    def _fill(self, rest: Counts, gpus: int) -> tuple[Counts, ...] | None:
        first = next((i for i, n in enumerate(rest) if n), None)
        if first is None:
            return ()
        if gpus < self.profiles.gpus_needed(rest) or gpus <= self.failed.get(rest, 0):
            return None
        for share in self.holding[first]:
            if all(s <= r for s, r in zip(share, rest, strict=True)):
                found = self._fill(tuple(r - s for r, s in zip(rest, share, strict=True)), gpus - 1)
                if found is not None:
                    return (share, *found)
        self.failed[rest] = gpus
        return None


def _spec(mig: MigModel | None, name: str) -> MigProfileSpec:
    spec = mig.profile(name) if mig is not None else None
    assert spec is not None  # resolved against the model before
    return spec


def _describe(names: tuple[str, ...], counts: Counts) -> str:
    return ", ".join(f"{c} x {n}" for n, c in zip(names, counts, strict=True) if c)
