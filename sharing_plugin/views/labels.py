"""Node labels from the plan: GPU Feature Discovery's sharing and MIG labels, computed exactly.

Schedulers select shared GPUs and MIG devices on the labels NVIDIA's gpu-feature-discovery
(GFD) publishes. GFD reads the config file on its own and can disagree with what the plugin
advertises after a hot reload; these labels are computed from the same plan the plugin serves,
so they cannot. Names and meanings follow GFD (its README's "Generated Labels", the
k8s-device-plugin README and GPU Operator docs on shared GPUs, and GFD's resource labeler):

- ``nvidia.com/gpu.product``: the GPU's name as NVML reports it, every character other than
  ``[A-Za-z0-9-_.]`` and space dropped and runs of spaces turned into ``-``
  (``NVIDIA-A100-SXM4-80GB``, ``Tesla-T4``), with ``-SHARED`` appended when its replicas are
  advertised under ``nvidia.com/gpu`` itself; a renamed resource (``rename``,
  ``renameByDefault``) gets no suffix.
- ``nvidia.com/gpu.count``: physical GPUs of that product, MIG-enabled ones included;
  ``nvidia.com/gpu.memory``: one GPU's memory in MiB (omitted when unknown);
  ``nvidia.com/gpu.family`` / ``.compute.major`` / ``.compute.minor``: its architecture.
- ``nvidia.com/gpu.replicas``: devices each GPU is advertised as (1: not shared; 0: every GPU
  of the product is MIG-advertised, so none is advertised whole); renamed replicas count too.
- ``nvidia.com/gpu.sharing-strategy``: ``time-slicing`` or ``mps`` when replicas > 1, else
  ``none``.
- ``nvidia.com/mig.capable``: some GPU supports MIG. ``nvidia.com/mps.capable``: the config
  shares with MPS and no GPU has MIG enabled (where GFD fails outright, this says false).
- ``nvidia.com/mig.strategy``: ``single`` or ``mixed``; absent under ``none``, as in GFD.
- migStrategy ``single``: ``gpu.product`` becomes ``<product>-MIG-<profile>``, ``gpu.count``
  the number of MIG devices, ``gpu.memory`` one MIG device's memory, plus
  ``gpu.multiprocessors`` and ``gpu.slices.gi`` / ``.slices.ci``. A node that breaks the
  strategy (a MIG-enabled GPU without MIG devices, MIG off on another, several profiles) gets
  GFD's ``<product>-MIG-INVALID`` with count, replicas and memory 0.
- migStrategy ``mixed``: per profile, ``nvidia.com/mig-<profile>.product`` / ``.count`` /
  ``.memory`` / ``.replicas`` / ``.sharing-strategy`` / ``.multiprocessors`` /
  ``.slices.gi`` / ``.slices.ci``, the profile written as its resource name (``1g.5gb+me`` ->
  ``mig-1g.5gb.me``). GFD's ``engines.*`` counts are not known without NVML's device attributes
  and are not published.

Where GFD leaves the answer open or this plugin goes further, the choice and why:

- Several products on one node: GFD's labels for them overwrite each other in no fixed order.
  Here the product with GPUs advertised whole wins, then the one with most GPUs, then the one
  holding the lowest index. MIG labels take the product and memory of the profile's first
  device (lowest GPU and MIG index). GPUs that did not answer discovery are left out unless
  no GPU answered.
- Per-GPU replica counts that differ (several entries for one name): ``replicas`` is the
  largest count, the smallest share of a GPU a pod can be given here, which is what a
  nodeSelector on replicas is meant to bound; ``-SHARED`` appears when any replicas of that
  name are advertised unrenamed.
- Renamed resources under ``nvidia.com/`` (``nvidia.com/gpu.shared``, one or several), and
  ``resources.gpus`` / ``resources.mig`` names: besides the GPU's own labels above, each gets
  ``<name>.product``, ``.count`` (physical devices behind it), ``.replicas`` (the largest),
  ``.sharing-strategy`` and ``.memory``, from its first device; names in other domains get
  none (their keys could belong to anyone, so the plugin could not own them), nor does a key
  whose name part would exceed Kubernetes' 63 characters. GFD's own keys win a clash.
- Health does not change labels (as in GFD): a GPU's count is physical; kubelet's allocatable
  shows what is healthy. Per-replica memory is not published: the config has no such setting
  and GFD publishes the physical memory under MPS too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sharing_plugin.config.model import Config, MigStrategy, SharingKind
from sharing_plugin.gpus.inventory import Gpu, Inventory, MigDevice
from sharing_plugin.plan.model import Plan
from sharing_plugin.plan.node import NodePlan

__all__ = [
    "FIXED_KEYS",
    "GPU_RESOURCE",
    "gfd_label_value",
    "labels",
    "labels_for",
    "mig_label_resource",
    "owns",
    "render_labels",
]

GPU_RESOURCE = "nvidia.com/gpu"
_PREFIX = "nvidia.com/"
MIG_STRATEGY = "nvidia.com/mig.strategy"
MIG_CAPABLE = "nvidia.com/mig.capable"
MPS_CAPABLE = "nvidia.com/mps.capable"
FIXED_KEYS = frozenset({MIG_STRATEGY, MIG_CAPABLE, MPS_CAPABLE})
"""Keys that are always ours to set or remove; the per-resource ones are matched by `owns`."""

_RESOURCE_SUFFIXES = ("product", "count", "replicas", "sharing-strategy", "memory")
_MIG_SUFFIXES = ("multiprocessors", "slices.gi", "slices.ci")
_ARCH_SUFFIXES = ("family", "compute.major", "compute.minor")
_OWNED = re.compile(
    r"nvidia\.com/(?:[A-Za-z0-9][-A-Za-z0-9_.]*)\.(?:"
    + "|".join(re.escape(s) for s in _RESOURCE_SUFFIXES + _MIG_SUFFIXES)
    + ")"
)
_ARCH_KEYS = frozenset(f"{GPU_RESOURCE}.{s}" for s in _ARCH_SUFFIXES)
_NAME_PART = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_UNSAFE = re.compile(r"[^A-Za-z0-9\-_. ]")
_MAX = 63  # a label value, and the name part of a key, hold at most 63 characters


def owns(key: str) -> bool:
    """Whether `key` is one of the labels this plugin publishes (to remove it once stale)."""
    return key in FIXED_KEYS or key in _ARCH_KEYS or _OWNED.fullmatch(key) is not None


def gfd_label_value(text: str) -> str:
    """`text` as GFD writes a product: unsafe characters dropped, spaces joined by `-`; cut to
    63 characters and to a letter or digit at both ends, so Kubernetes accepts it."""
    value = "-".join(_UNSAFE.sub("", text).split())[:_MAX]
    return value.strip("-_.")


def mig_label_resource(profile: str) -> str:
    """The resource GFD labels a MIG profile under: `1g.5gb+me` -> `nvidia.com/mig-1g.5gb.me`."""
    return f"{_PREFIX}mig-{profile.replace('+', '.')}"


def render_labels(labels: Mapping[str, str]) -> str:
    """`key=value` lines sorted by key, each ending in a newline (NFD's feature file format)."""
    return "".join(f"{key}={labels[key]}\n" for key in sorted(labels))


@dataclass(frozen=True, slots=True)
class _Advertised:
    """How one physical device (GPU or MIG) is advertised: under which name, how many times."""

    resource: str
    replicas: int


def labels(config: Config, node: NodePlan) -> dict[str, str]:
    """The labels `config` gives the node `node` plans (the node as it will be)."""
    return labels_for(config, node.inventory, node.plan)


def labels_for(config: Config, inventory: Inventory, plan: Plan) -> dict[str, str]:
    """The labels of a node whose GPUs are `inventory` and which advertises `plan`."""
    if not inventory.gpus:
        return {}
    advertised = {
        d.physical: _Advertised(r.name, d.replicas) for r in plan.resources for d in r.devices
    }
    kind = config.sharing.kind
    strategy = config.flags.mig_strategy
    out: dict[str, str] = {}
    gfd_names = {GPU_RESOURCE}
    if strategy is MigStrategy.MIXED:
        gfd_names |= {mig_label_resource(m.profile) for _, m in _mig_devices(inventory)}
    for resource in plan.resources:  # extensions first: GFD's own keys win a clash
        if resource.name not in gfd_names and resource.devices:
            out.update(_renamed_labels(resource.name, inventory, plan, kind))
    out[MIG_CAPABLE] = _bool(any(g.mig_capable for g in inventory.gpus))
    mps = kind is SharingKind.MPS and not any(g.mig_enabled for g in inventory.gpus)
    out[MPS_CAPABLE] = _bool(mps)
    if strategy is not MigStrategy.NONE:
        out[MIG_STRATEGY] = strategy.value
    out.update(_gpu_labels(inventory, advertised, strategy, kind))
    if strategy is MigStrategy.SINGLE:
        out.update(_single_labels(inventory, advertised, kind))
    elif strategy is MigStrategy.MIXED:
        out.update(_mixed_labels(inventory, advertised, kind))
    return out


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _mig_advertised(gpu: Gpu, strategy: MigStrategy) -> bool:
    return gpu.mig_enabled and strategy is not MigStrategy.NONE


def _mig_devices(inventory: Inventory) -> list[tuple[Gpu, MigDevice]]:
    return [
        (g, m)
        for g in sorted(inventory.gpus, key=lambda g: g.index)
        if g.mig_enabled
        for m in sorted(g.mig_devices, key=lambda m: m.index)
    ]


def _sharing(
    name: str,
    physical: Iterable[str],
    advertised: Mapping[str, _Advertised],
    kind: SharingKind,
) -> tuple[int, str, bool]:
    """(replicas, sharing-strategy, whether replicas are advertised under `name` itself)."""
    found = [advertised[p] for p in physical if p in advertised]
    replicas = max((a.replicas for a in found), default=1)
    unrenamed = any(a.replicas > 1 and a.resource == name for a in found)
    return replicas, (kind.value if replicas > 1 else SharingKind.NONE.value), unrenamed


def _resource_labels(
    name: str,
    *,
    product: str,
    count: int,
    replicas: int,
    strategy: str,
    memory_mib: int,
) -> dict[str, str]:
    out = {
        f"{name}.product": product,
        f"{name}.count": str(count),
        f"{name}.replicas": str(replicas),
        f"{name}.sharing-strategy": strategy,
    }
    if memory_mib > 0:  # GFD leaves memory out when NVML reports none
        out[f"{name}.memory"] = str(memory_mib)
    return out


def _shared_product(product: str, shared_unrenamed: bool) -> str:
    return gfd_label_value(f"{product} SHARED" if shared_unrenamed else product)


def _gpu_labels(
    inventory: Inventory,
    advertised: Mapping[str, _Advertised],
    strategy: MigStrategy,
    kind: SharingKind,
) -> dict[str, str]:
    answered = [g for g in inventory.gpus if g.healthy_at_discovery] or list(inventory.gpus)
    groups: dict[str, list[Gpu]] = {}
    for gpu in sorted(answered, key=lambda g: g.index):
        groups.setdefault(gpu.product, []).append(gpu)

    def rank(gpus: list[Gpu]) -> tuple[bool, int, int]:
        whole = any(not _mig_advertised(g, strategy) for g in gpus)
        return (not whole, -len(gpus), gpus[0].index)

    gpus = min(groups.values(), key=rank)
    first = gpus[0]
    whole = [g.uuid for g in gpus if not _mig_advertised(g, strategy)]
    if whole:
        replicas, sharing, unrenamed = _sharing(GPU_RESOURCE, whole, advertised, kind)
    else:  # GFD labels MIG-advertised GPUs "without sharing": no whole GPU to replicate
        replicas, sharing, unrenamed = 0, SharingKind.NONE.value, False
    out = _resource_labels(
        GPU_RESOURCE,
        product=_shared_product(first.product, unrenamed),
        count=len(gpus),
        replicas=replicas,
        strategy=sharing,
        memory_mib=first.memory_mib,
    )
    major, minor = first.compute_capability
    if major > 0:
        out[f"{GPU_RESOURCE}.family"] = _family(major, minor)
        out[f"{GPU_RESOURCE}.compute.major"] = str(major)
        out[f"{GPU_RESOURCE}.compute.minor"] = str(minor)
    return out


def _family(major: int, minor: int) -> str:
    """GFD's architecture family of a compute capability."""
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ampere" if minor < 9 else "ada-lovelace"
    names = {1: "tesla", 2: "fermi", 3: "kepler", 5: "maxwell", 6: "pascal", 9: "hopper"}
    return names.get(major, "undefined")


def _mig_product(gpu: Gpu, mig: MigDevice) -> str:
    return f"{gpu.product} MIG {mig.profile.replace('+', '.')}"


def _slices(profile: str) -> str:
    """GPU-instance slices of a profile: the `N` of `Ng.…` (the compute instance spans it)."""
    head, _, _ = profile.partition("g.")
    return head if head.isdigit() else ""


def _mig_labels(
    name: str,
    migs: list[tuple[Gpu, MigDevice]],
    advertised: Mapping[str, _Advertised],
    kind: SharingKind,
) -> dict[str, str]:
    gpu, first = migs[0]
    replicas, sharing, unrenamed = _sharing(name, (m.uuid for _, m in migs), advertised, kind)
    out = _resource_labels(
        name,
        product=_shared_product(_mig_product(gpu, first), unrenamed),
        count=len(migs),
        replicas=replicas,
        strategy=sharing,
        memory_mib=first.memory_mib,
    )
    if first.sm_count > 0:
        out[f"{name}.multiprocessors"] = str(first.sm_count)
    slices = _slices(first.profile)
    if slices:
        out[f"{name}.slices.gi"] = slices
        out[f"{name}.slices.ci"] = slices
    return out


def _single_labels(
    inventory: Inventory, advertised: Mapping[str, _Advertised], kind: SharingKind
) -> dict[str, str]:
    enabled = [g for g in sorted(inventory.gpus, key=lambda g: g.index) if g.mig_enabled]
    if not enabled:  # no MIG anywhere: single labels as none does
        return {}
    migs = _mig_devices(inventory)
    invalid = (
        any(not g.mig_devices for g in enabled)
        or len(enabled) < len(inventory.gpus)
        or len({m.profile for _, m in migs}) != 1
    )
    if invalid:
        return {
            f"{GPU_RESOURCE}.product": gfd_label_value(f"{enabled[0].product} MIG INVALID"),
            f"{GPU_RESOURCE}.count": "0",
            f"{GPU_RESOURCE}.replicas": "0",
            f"{GPU_RESOURCE}.memory": "0",
            f"{GPU_RESOURCE}.sharing-strategy": SharingKind.NONE.value,
        }
    return _mig_labels(GPU_RESOURCE, migs, advertised, kind)


def _mixed_labels(
    inventory: Inventory, advertised: Mapping[str, _Advertised], kind: SharingKind
) -> dict[str, str]:
    by_profile: dict[str, list[tuple[Gpu, MigDevice]]] = {}
    for gpu, mig in _mig_devices(inventory):
        by_profile.setdefault(mig_label_resource(mig.profile), []).append((gpu, mig))
    out: dict[str, str] = {}
    for name, migs in by_profile.items():
        out.update(_mig_labels(name, migs, advertised, kind))
    return out


def _renamed_labels(
    name: str, inventory: Inventory, plan: Plan, kind: SharingKind
) -> dict[str, str]:
    """This plugin's labels for a resource GFD has no labels for (see the module docstring)."""
    prefix, _, part = name.partition("/")
    longest = f"{part}.sharing-strategy"
    if f"{prefix}/" != _PREFIX or len(longest) > _MAX or not _NAME_PART.fullmatch(part):
        return {}
    resource = plan.resource(name)
    if resource is None:
        return {}
    first = resource.devices[0]
    gpu = inventory.gpu(first.gpu_uuid)
    mig = inventory.mig_device(first.physical) if first.is_mig else None
    if gpu is None:
        return {}
    replicas_by_physical = {d.physical: d.replicas for d in resource.devices}
    replicas = max(replicas_by_physical.values())
    return _resource_labels(
        name,
        product=gfd_label_value(_mig_product(gpu, mig) if mig is not None else gpu.product),
        count=len(replicas_by_physical),
        replicas=replicas,
        strategy=kind.value if replicas > 1 else SharingKind.NONE.value,
        memory_mib=mig.memory_mib if mig is not None else gpu.memory_mib,
    )
