"""Which GPUs each `partitioning.mig` entry selects on this node (pure).

A layout describes a whole GPU, so only GPU references make sense here: indices, GPU UUIDs and
product globs. `all` and a count pick from the MIG-capable GPUs only, so that one layout can be
shipped to nodes that mix MIG and non-MIG GPUs; a GPU named explicitly is taken as asked, and
the caller reports it if it cannot do MIG. Config validation already rejects entries that
certainly overlap; an index and a UUID (or a product glob) naming the same GPU can only be seen
here, against the inventory, and is reported the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from sharing_plugin.config.model import (
    GpuIndexRef,
    MigGiCiRef,
    MigIndexRef,
    MigLayout,
    Partitioning,
    ProductRef,
    UuidRef,
)
from sharing_plugin.config.names import glob_matches
from sharing_plugin.errors import Problem
from sharing_plugin.gpus.catalog import model_for
from sharing_plugin.gpus.inventory import Gpu, Inventory

__all__ = ["SelectedLayout", "entry_path", "select_layouts"]


@dataclass(frozen=True, slots=True)
class SelectedLayout:
    """The layout one entry wants on one GPU."""

    gpu: Gpu
    entry: int  # index in partitioning.mig
    layout: MigLayout


def entry_path(entry: int) -> str:
    return f"partitioning.mig[{entry}]"


def _mig_capable(gpu: Gpu) -> bool:
    model = model_for(gpu.product)
    return gpu.mig_capable or (model is not None and model.mig is not None)


def _describe(gpu: Gpu) -> str:
    return f"GPU {gpu.index} ({gpu.product}, {gpu.uuid})"


def _select(
    layout: MigLayout, entry: int, inventory: Inventory, problems: list[Problem]
) -> list[Gpu]:
    path = f"{entry_path(entry)}.devices"
    capable = [g for g in inventory.gpus if _mig_capable(g)]
    selection = layout.devices
    if selection == "all":
        return capable
    if isinstance(selection, int):
        if selection > len(capable):
            problems.append(
                Problem(
                    path,
                    f"asks for the first {selection} MIG-capable GPUs, but this node has "
                    f"{len(capable)}: lower the count or list the GPUs",
                )
            )
            return []
        return capable[:selection]
    chosen: dict[str, Gpu] = {}
    for j, ref in enumerate(selection):
        ref_path = f"{path}[{j}]"
        matched: list[Gpu] = []
        if isinstance(ref, GpuIndexRef):
            matched = [g for g in inventory.gpus if g.index == ref.index]
            missing = f"GPU {ref.index} does not exist on this node ({len(inventory.gpus)} GPUs)"
        elif isinstance(ref, UuidRef):
            matched = [g for g in inventory.gpus if g.uuid == ref.uuid]
            missing = f"no GPU on this node has UUID {ref.uuid}"
            if ref.uuid.startswith("MIG-"):
                missing = f"{ref.uuid} is a MIG device; a MIG layout applies to whole GPUs"
        elif isinstance(ref, MigIndexRef | MigGiCiRef):
            problems.append(
                Problem(
                    ref_path,
                    "names a MIG device; a MIG layout applies to whole GPUs: list the GPU "
                    "index or its GPU- UUID",
                )
            )
            continue
        elif isinstance(ref, ProductRef):
            # A product that is not on this node selects nothing: one ConfigMap serves a fleet.
            matched = [g for g in inventory.gpus if glob_matches(ref.product, g.product)]
            missing = ""
        if not matched and missing:
            problems.append(Problem(ref_path, f"{missing}: remove it or fix the reference"))
        for gpu in matched:
            chosen.setdefault(gpu.uuid, gpu)
    return sorted(chosen.values(), key=lambda g: g.index)


def select_layouts(
    partitioning: Partitioning | None, inventory: Inventory
) -> tuple[list[SelectedLayout], list[Problem]]:
    """Per selected GPU, the entry that lays it out; and what is wrong with the selections.

    A GPU that two entries select gets neither layout: both entries are reported, and the GPU
    is left as it is rather than guessing which one the admin meant.
    """
    if partitioning is None:
        return [], []
    problems: list[Problem] = []
    owners: dict[str, list[int]] = {}
    layouts: dict[tuple[str, int], SelectedLayout] = {}
    for entry, layout in enumerate(partitioning.mig):
        for gpu in _select(layout, entry, inventory, problems):
            owners.setdefault(gpu.uuid, []).append(entry)
            layouts[gpu.uuid, entry] = SelectedLayout(gpu, entry, layout)
    selected: list[SelectedLayout] = []
    for uuid, entries in owners.items():
        if len(entries) > 1:
            gpu = layouts[uuid, entries[0]].gpu
            first = entry_path(entries[0])
            for later in entries[1:]:
                problems.append(
                    Problem(
                        f"{entry_path(later)}.devices",
                        f"selects {_describe(gpu)}, which {first} selects too; each GPU gets "
                        "one layout: make the selections disjoint",
                    )
                )
            continue
        selected.append(layouts[uuid, entries[0]])
    selected.sort(key=lambda s: s.gpu.index)
    return selected, problems
