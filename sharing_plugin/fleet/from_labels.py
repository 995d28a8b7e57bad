"""A node's GPUs rebuilt from the labels gpu-feature-discovery (or this plugin) put on it.

The fleet view plans nodes it cannot ask NVML about: their labels are all it has. What the
labels give, and what the GPU catalog fills in:

- `nvidia.com/gpu.product` names the model (a `-SHARED` suffix is dropped) and
  `nvidia.com/gpu.count` the number of GPUs. Memory, compute capability and MIG capability come
  from `gpu.memory`, `gpu.compute.major/minor` and `mig.capable` when present, else from the
  catalogued model. An uncatalogued product keeps its label text as its name, without MIG.
- MIG strategy `single` (a product `<model>-MIG-<profile>`): `gpu.count` counts MIG devices,
  spread over as few GPUs as hold them.
- MIG strategy `mixed`: each `nvidia.com/mig-<profile>.count` gives MIG devices of that
  profile, spread over as few GPUs as hold them; those GPUs have MIG on, the others off,
  unless `gpu.replicas` is 0, which both GFD and this plugin publish only when no GPU of the
  product is advertised whole: then all have MIG on. A profile whose own `.product` names
  another model (a node with two models) is spread over extra GPUs of that model, as many as
  it takes: GFD counts only one model's GPUs.
- Labels count MIG devices per node, not per GPU: the split into per-GPU layouts, and each
  layout's placements, come from the MIG solver, so every node whose GPUs could hold the
  counted devices is planned (the module that spreads them says how a split is chosen).
- Labels cannot say which GPU is which, so GPU and MIG UUIDs are made up (`GPU-labels-<n>`);
  a config that selects devices by UUID cannot be previewed and shows up as an error.
- Labels that cannot describe GPUs (none at all, GFD's `MIG-INVALID`, a profile the model does
  not have, more MIG devices than its GPUs hold) raise `NodeLabelsError` saying so.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from sharing_plugin.errors import MigError, SharingPluginError
from sharing_plugin.gpus.catalog import MODELS, GpuModel, MigProfileSpec, model_for
from sharing_plugin.gpus.inventory import Gpu, GpuUuid, Inventory, MigDevice, MigUuid
from sharing_plugin.mig.layout import MigCreate
from sharing_plugin.mig.spread import spread_layouts
from sharing_plugin.views.labels import GPU_RESOURCE, gfd_label_value

__all__ = ["NodeLabelsError", "node_inventory"]

_PRODUCT = f"{GPU_RESOURCE}.product"
_COUNT = f"{GPU_RESOURCE}.count"
_MIG_STRATEGY = "nvidia.com/mig.strategy"
_MIG_PREFIX = "nvidia.com/mig-"
_SHARED = "-SHARED"
_BY_LABEL = {gfd_label_value(p): p for m in MODELS for p in m.products}


class NodeLabelsError(SharingPluginError):
    """A node's labels do not describe its GPUs (the fleet view skips it, with this reason)."""


def _int_label(labels: Mapping[str, str], key: str) -> int | None:
    text = labels.get(key)
    if text is None:
        return None
    if not text.isdigit():
        raise NodeLabelsError(f"{key} is not a count (got {text!r})")
    return int(text)


def _model_product(label: str) -> tuple[str, GpuModel | None]:
    """The NVML product name behind a product label, and its catalogued model."""
    product = _BY_LABEL.get(label) or _BY_LABEL.get(f"NVIDIA-{label}") or label
    return product, model_for(product)


def _profile(model: GpuModel | None, product: str, label: str) -> MigProfileSpec:
    """The profile a label names (`1g.5gb.me` is `1g.5gb+me`) on `model`."""
    found = None
    if model is not None and model.mig is not None:
        found = next((p for p in model.mig.profiles if p.name.replace("+", ".") == label), None)
    if found is None:
        raise NodeLabelsError(f"MIG profile {label!r} is not one of {product}'s")
    return found


def _spread(
    model: GpuModel, wanted: Mapping[str, int], gpus: int | None
) -> tuple[tuple[MigCreate, ...], ...]:
    """Per GPU that holds some of `wanted` ({profile: devices}), its placements: on as few
    GPUs as hold them, at most `gpus` (None: as many as that takes)."""
    try:
        return spread_layouts(model, wanted, gpus=gpus)
    except MigError as exc:
        raise NodeLabelsError(str(exc)) from None


def _counted(specs: Sequence[MigProfileSpec]) -> Counter[str]:
    return Counter(s.name for s in specs)


@dataclass(frozen=True, slots=True)
class _Described:
    """What a node's labels say about one GPU, before a UUID is made up for it."""

    product: str
    model: GpuModel | None
    memory_mib: int
    compute_capability: tuple[int, int]
    mig_capable: bool
    layout: tuple[MigCreate, ...] | None  # its MIG devices, or None: MIG off


def _inventory(described: Sequence[_Described], mig_memory: Mapping[str, int]) -> Inventory:
    gpus = []
    for index, node in enumerate(described):
        uuid = GpuUuid(f"GPU-labels-{index}")
        migs = []
        for j, create in enumerate(node.layout or ()):
            spec = _spec(node.model, create.profile)
            migs.append(
                MigDevice(
                    uuid=MigUuid(f"MIG-labels-{index}-{j}"),
                    parent_uuid=uuid,
                    parent_index=index,
                    index=j,
                    gi_id=j + 1,
                    ci_id=0,
                    profile=spec.name,
                    gi_profile_id=spec.gi_profile_id,
                    placement=create.placement,
                    memory_mib=mig_memory.get(spec.name, spec.memory_mib),
                    sm_count=spec.sm_count,
                )
            )
        gpus.append(
            Gpu(
                index=index,
                uuid=uuid,
                product=node.product,
                memory_mib=node.memory_mib,
                minor=index,
                pci_bus_id="",
                numa_node=None,
                compute_capability=node.compute_capability,
                mig_capable=node.mig_capable,
                mig_enabled=node.layout is not None,
                mig_pending=node.layout is not None,  # as discovered: no mode change waits
                mig_devices=tuple(migs),
            )
        )
    return Inventory(gpus=tuple(gpus))


def _spec(model: GpuModel | None, name: str) -> MigProfileSpec:
    spec = model.mig.profile(name) if model is not None and model.mig is not None else None
    assert spec is not None  # placed by the solver, so the model has it
    return spec


def _catalogued(
    product: str, model: GpuModel | None, layout: tuple[MigCreate, ...] | None
) -> _Described:
    return _Described(
        product=product,
        model=model,
        memory_mib=model.memory_mib if model is not None else 0,
        compute_capability=model.compute_capability if model is not None else (0, 0),
        mig_capable=model is not None and model.mig is not None,
        layout=layout,
    )


def _mixed_profiles(
    labels: Mapping[str, str], product: str, model: GpuModel | None, mig_memory: dict[str, int]
) -> dict[str, tuple[GpuModel | None, list[MigProfileSpec]]]:
    """Per product, the MIG devices `mig-<profile>.count` labels list; a profile's own
    `.product` label names its model where the node has several."""
    wanted: dict[str, tuple[GpuModel | None, list[MigProfileSpec]]] = {}
    for key in sorted(labels):
        if not (key.startswith(_MIG_PREFIX) and key.endswith(".count")):
            continue
        profile = key[len(_MIG_PREFIX) : -len(".count")]
        owner, owner_model = product, model
        shown = labels.get(f"{_MIG_PREFIX}{profile}.product", "").removesuffix(_SHARED)
        head, sep, _ = shown.partition("-MIG-")
        if sep:
            owner, owner_model = _model_product(head)
        spec = _profile(owner_model, owner, profile)
        wanted.setdefault(owner, (owner_model, []))[1].extend(
            [spec] * (_int_label(labels, key) or 0)
        )
        found = _int_label(labels, f"{_MIG_PREFIX}{profile}.memory")
        if found is not None:
            mig_memory[spec.name] = found
    return wanted


def node_inventory(labels: Mapping[str, str]) -> Inventory:
    """The GPUs a node's labels describe; raises NodeLabelsError saying why they do not."""
    product_label, count = labels.get(_PRODUCT), _int_label(labels, _COUNT)
    if product_label is None or count is None:
        raise NodeLabelsError(
            f"no GPU labels ({_PRODUCT} and {_COUNT}): gpu-feature-discovery or this plugin "
            "has not labelled it"
        )
    if count == 0:
        raise NodeLabelsError(f"{_COUNT} is 0")
    head, single, profile_label = product_label.removesuffix(_SHARED).partition("-MIG-")
    product, model = _model_product(head)
    if single and profile_label == "INVALID":
        raise NodeLabelsError(
            f"{_PRODUCT} is {product_label}: MIG strategy single is invalid on this node, so "
            "its labels do not say what its GPUs hold"
        )
    mig_memory: dict[str, int] = {}
    layouts: list[tuple[MigCreate, ...] | None]
    extra: list[_Described] = []
    if single:  # the count is of MIG devices, on as many GPUs as hold them
        spec = _profile(model, product, profile_label)
        assert model is not None
        if (found := _int_label(labels, f"{GPU_RESOURCE}.memory")) is not None:
            mig_memory[spec.name] = found
        layouts = list(_spread(model, {spec.name: count}, None))
    else:
        mixed = labels.get(_MIG_STRATEGY) == "mixed"
        wanted = _mixed_profiles(labels, product, model, mig_memory) if mixed else {}
        _, own = wanted.pop(product, (model, []))
        all_mig = mixed and labels.get(f"{GPU_RESOURCE}.replicas") == "0"
        if (own or all_mig) and (model is None or model.mig is None):
            raise NodeLabelsError(f"{product} has MIG labels but is not a MIG-capable model")
        spread = _spread(model, _counted(own), count) if model is not None and own else ()
        # The GPUs that hold no MIG device: MIG on but empty where no GPU is advertised whole.
        layouts = [*spread, *[() if all_mig else None] * (count - len(spread))]
        for other, (other_model, specs) in wanted.items():
            assert other_model is not None  # _profile found the profile on it
            for layout in _spread(other_model, _counted(specs), None):
                extra.append(_catalogued(other, other_model, layout))
    major = _int_label(labels, f"{GPU_RESOURCE}.compute.major")
    minor = _int_label(labels, f"{GPU_RESOURCE}.compute.minor") or 0
    memory = None if single else _int_label(labels, f"{GPU_RESOURCE}.memory")
    base = _catalogued(product, model, None)
    own_gpu = replace(
        base,
        memory_mib=memory or base.memory_mib,
        compute_capability=(major, minor) if major else base.compute_capability,
        mig_capable=base.mig_capable or labels.get("nvidia.com/mig.capable") == "true",
    )
    return _inventory([replace(own_gpu, layout=layout) for layout in layouts] + extra, mig_memory)
