"""Sharing: selected devices become replicas, under their own name or a new one.

Each `sharing.*.resources` entry selects devices of one resource; each selected device becomes
`replicas` virtual devices `<uuid>::0 … <uuid>::<replicas-1>` (the reference's numbering, so
raising replicas keeps the existing IDs). Several entries for one name give different replica
counts per GPU; a device may be selected by one entry only. Devices no entry selects stay under
their original name, unshared.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sharing_plugin.config.model import (
    MAX_DEVICES_PER_RESOURCE,
    Config,
    DeviceRef,
    DeviceSelection,
    GpuIndexRef,
    MigGiCiRef,
    MigIndexRef,
    ProductRef,
    ReplicatedResource,
    SharingKind,
    UuidRef,
)
from sharing_plugin.config.names import glob_matches
from sharing_plugin.config.rules import advertised_name
from sharing_plugin.errors import Problem
from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.plan.model import ResourcePlan, VirtualDevice, replica_id
from sharing_plugin.plan.mps import (
    MPS_CLIENTS_NEW,
    MPS_CLIENTS_OLD,
    MpsDaemon,
    MpsGpu,
    MpsShare,
    gpu_problems,
    mps_client_limit,
    mps_daemon,
    share_for,
)

BaseDevices = dict[str, list[VirtualDevice]]
"""Resource name -> its devices before sharing, in GPU then MIG index order."""

__all__ = [
    "MPS_CLIENTS_NEW",
    "MPS_CLIENTS_OLD",
    "BaseDevices",
    "Shared",
    "apply_sharing",
    "mps_client_limit",
    "too_many_devices",
]


@dataclass(frozen=True, slots=True)
class Shared:
    """The resources after sharing, and what the sharing section got wrong or should say."""

    resources: list[ResourcePlan]
    sources: dict[str, str]  # resource name -> path of the first sharing entry producing it
    problems: tuple[Problem, ...] = ()
    warnings: tuple[str, ...] = ()
    mps: tuple[MpsDaemon, ...] = ()  # one control daemon per MPS resource


@dataclass(slots=True)
class _Found:
    """Devices an entry selects, and the problems and warnings found on the way."""

    devices: list[VirtualDevice]
    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Share:
    target: str
    replicas: int
    path: str
    mps: MpsShare | None = None


def _device_order(device: VirtualDevice) -> tuple[int, int, int]:
    gpu, _, mig = device.index.partition(":")
    return int(gpu), int(mig) if mig else -1, device.replica if device.replica is not None else -1


def _replica(device: VirtualDevice, n: int, replicas: int) -> VirtualDevice:
    """Replica `n` of `device`. Spelled out, not `dataclasses.replace`: this runs once per
    advertised replica (7,168 on a big node) and `replace` costs ~60 % more per device."""
    return VirtualDevice(
        id=replica_id(device.physical, n),
        physical=device.physical,
        gpu_uuid=device.gpu_uuid,
        index=device.index,
        numa=device.numa,
        paths=device.paths,
        healthy=device.healthy,
        discovered_healthy=device.discovered_healthy,
        replica=n,
        replicas=replicas,
        is_mig=device.is_mig,
        compute_capability=device.compute_capability,
    )


def _describe(device: VirtualDevice) -> str:
    kind = "MIG device" if device.is_mig else "GPU"
    return f"{kind} {device.index} ({device.physical})"


class _Selector:
    """Resolves one entry's `devices` against the devices of its resource."""

    def __init__(self, inventory: Inventory, base: BaseDevices) -> None:
        self.inventory = inventory
        self.owner = {d.physical: name for name, devices in base.items() for d in devices}

    def select(self, entry: ReplicatedResource, devices: list[VirtualDevice], path: str) -> _Found:
        """The devices `entry` selects among `devices`, with what is wrong or worth saying."""
        selection: DeviceSelection = entry.devices
        if selection == "all":
            if devices:
                return _Found(list(devices))
            return _Found(
                [],
                warnings=[
                    f"{path}.name: this node has no {entry.name} devices, so this entry "
                    "shares nothing here"
                ],
            )
        if isinstance(selection, int):
            if selection > len(devices):
                return _Found(
                    [],
                    problems=[
                        Problem(
                            f"{path}.devices",
                            f"asks for the first {selection} {entry.name} devices, but this "
                            f"node has {len(devices)}: lower the count or list the devices",
                        )
                    ],
                )
            return _Found(list(devices[:selection]))
        found = _Found([])
        chosen: dict[str, VirtualDevice] = {}
        for j, ref in enumerate(selection):
            ref_path = f"{path}.devices[{j}]"
            matched = [d for d in devices if self._matches(ref, d)]
            if not matched:
                if isinstance(ref, ProductRef):
                    found.warnings.append(
                        f"{ref_path}: no {entry.name} device on this node is on a GPU whose "
                        f"product matches {ref.product!r}, so it selects nothing"
                    )
                else:
                    found.problems.append(Problem(ref_path, self._missing(ref, entry.name)))
            for d in matched:
                chosen.setdefault(d.physical, d)
        order = {d.physical: i for i, d in enumerate(devices)}
        found.devices.extend(sorted(chosen.values(), key=lambda d: order[d.physical]))
        return found

    def _matches(self, ref: DeviceRef, device: VirtualDevice) -> bool:
        if isinstance(ref, GpuIndexRef):
            return not device.is_mig and device.index == str(ref.index)
        if isinstance(ref, MigIndexRef):
            return device.is_mig and device.index == f"{ref.gpu}:{ref.mig}"
        if isinstance(ref, UuidRef):
            return device.physical == ref.uuid
        if isinstance(ref, MigGiCiRef):
            mig = self.inventory.mig_device(device.physical) if device.is_mig else None
            return (
                mig is not None
                and mig.parent_uuid == ref.gpu_uuid
                and (mig.gi_id, mig.ci_id) == (ref.gi, ref.ci)
            )
        gpu = self.inventory.gpu(device.gpu_uuid)
        return gpu is not None and glob_matches(ref.product, gpu.product)

    def _missing(self, ref: DeviceRef, name: str) -> str:
        """Why a reference selects nothing, and where the device it names went instead."""
        what, physical = self._locate(ref)
        if physical is None:
            return f"{what} does not exist on this node: {self._node_summary()}"
        owner = self.owner.get(physical)
        if owner is None:
            return (
                f"{what} is not advertised on this node under the current migStrategy "
                f"(it is MIG-enabled, or MIG is off on its GPU), so it cannot be shared as {name}"
            )
        return f"{what} is advertised as {owner}, not {name}: move it to an entry named {owner}"

    def _locate(self, ref: DeviceRef) -> tuple[str, str | None]:
        inv = self.inventory
        if isinstance(ref, GpuIndexRef):
            gpu = next((g for g in inv.gpus if g.index == ref.index), None)
            return f"GPU {ref.index}", gpu.uuid if gpu else None
        if isinstance(ref, MigIndexRef):
            mig = next(
                (
                    m
                    for g in inv.gpus
                    if g.index == ref.gpu
                    for m in g.mig_devices
                    if m.index == ref.mig
                ),
                None,
            )
            return f"MIG device {ref.gpu}:{ref.mig}", mig.uuid if mig else None
        if isinstance(ref, UuidRef):
            known = inv.gpu(ref.uuid) or inv.mig_device(ref.uuid)
            return f"device {ref.uuid}", ref.uuid if known else None
        if isinstance(ref, MigGiCiRef):
            mig = next(
                (
                    m
                    for g in inv.gpus
                    for m in g.mig_devices
                    if m.parent_uuid == ref.gpu_uuid and (m.gi_id, m.ci_id) == (ref.gi, ref.ci)
                ),
                None,
            )
            label = f"MIG device MIG-{ref.gpu_uuid}/{ref.gi}/{ref.ci}"
            return label, mig.uuid if mig else None
        return f"product {ref.product!r}", None

    def _node_summary(self) -> str:
        gpus = self.inventory.gpus
        if not gpus:
            return "the node has no GPUs"
        parts = []
        for g in sorted(gpus, key=lambda g: g.index):
            migs = ", ".join(f"{g.index}:{m.index}" for m in g.mig_devices)
            parts.append(f"{g.index}" + (f" (MIG {migs})" if migs else ""))
        return "it has GPU " + ", ".join(parts)


def _mps_problems(
    entry: ReplicatedResource, selected: list[VirtualDevice], inventory: Inventory, path: str
) -> _Found:
    """What is wrong with sharing `selected` by MPS (`devices` stays empty)."""
    problems: list[Problem] = []
    warnings: list[str] = []
    migs = [d for d in selected if d.is_mig]
    if migs:
        listed = ", ".join(_describe(d) for d in migs[:4]) + (" …" if len(migs) > 4 else "")
        problems.append(
            Problem(
                f"{path}.devices",
                f"MPS cannot share MIG devices ({listed}): share whole GPUs with MPS, or use "
                "timeSlicing for MIG devices",
            )
        )
    # One report per kind of GPU: eight identical GPUs make one problem, not eight.
    seen: set[tuple[str, int]] = set()
    for d in selected:
        gpu = inventory.gpu(d.gpu_uuid)
        if d.is_mig or gpu is None or (gpu.product, gpu.memory_mib) in seen:
            continue
        seen.add((gpu.product, gpu.memory_mib))
        found, risky = gpu_problems(entry, share_for(entry, gpu), gpu, path)
        problems.extend(found)
        warnings.extend(risky)
    return _Found([], problems, warnings)


def too_many_devices(resource: str, count: int, path: str) -> Problem:
    """The problem of a resource advertising more devices than one ListAndWatch can carry."""
    return Problem(
        path,
        f"{resource} would advertise {count:,} devices, over the "
        f"{MAX_DEVICES_PER_RESOURCE:,} kubelet accepts for one resource (its 4 MiB "
        "ListAndWatch message limit): lower replicas or spread devices over more names",
    )


def apply_sharing(
    config: Config,
    inventory: Inventory,
    base: BaseDevices,
) -> Shared:
    """The resources after sharing, with the sharing section's problems and warnings."""
    problems: list[Problem] = []
    warnings: list[str] = []
    sharing = config.sharing.active
    kind = config.sharing.kind
    if sharing is None:
        return Shared([ResourcePlan(name, tuple(devs)) for name, devs in base.items()], {})
    section = "sharing.mps" if kind is SharingKind.MPS else "sharing.timeSlicing"
    selector = _Selector(inventory, base)
    shares: dict[str, _Share] = {}
    sources: dict[str, str] = {}
    for i, entry in enumerate(sharing.resources):
        path = f"{section}.resources[{i}]"
        found = selector.select(entry, base.get(entry.name, []), path)
        if kind is SharingKind.MPS:
            mps_found = _mps_problems(entry, found.devices, inventory, path)
            found.problems.extend(mps_found.problems)
            found.warnings.extend(mps_found.warnings)
        problems.extend(found.problems)
        warnings.extend(found.warnings)
        selected = found.devices
        target = advertised_name(entry, sharing)
        sources.setdefault(target, path)
        for d in selected:
            earlier = shares.get(d.physical)
            if earlier is not None:
                problems.append(
                    Problem(
                        f"{path}.devices",
                        f"{_describe(d)} is already shared by {earlier.path}: a device can be "
                        "shared by one entry only; remove it from one of them",
                    )
                )
                continue
            gpu = inventory.gpu(d.gpu_uuid)
            mps = share_for(entry, gpu) if kind is SharingKind.MPS and gpu is not None else None
            replicas = mps.replicas if mps is not None else entry.replicas
            shares[d.physical] = _Share(target, max(replicas, 1), path, mps=mps)

    # Counted before anything is built: replicas past kubelet's limit are refused, not made
    # (30,001 replicas of two GPUs took a quarter of a second to build only to be refused).
    totals: dict[str, int] = {}
    for name, devices in base.items():
        for d in devices:
            share = shares.get(d.physical)
            target = name if share is None else share.target
            totals[target] = totals.get(target, 0) + (1 if share is None else share.replicas)
    oversized = [t for t, n in totals.items() if n > MAX_DEVICES_PER_RESOURCE]
    problems.extend(too_many_devices(t, totals[t], sources.get(t, "")) for t in oversized)

    out: dict[str, list[VirtualDevice]] = {}
    feeds: dict[str, set[str]] = {}
    for name, devices in base.items():
        for d in devices:
            share = shares.get(d.physical)
            target = name if share is None else share.target
            if target in oversized:
                continue
            feeds.setdefault(target, set()).add(name)
            bucket = out.setdefault(target, [])
            if share is None:
                bucket.append(d)
            else:
                bucket.extend(_replica(d, n, share.replicas) for n in range(share.replicas))
    for target, names in feeds.items():
        if len(names) > 1:  # devices of several names merged: back to GPU, MIG, replica order
            out[target].sort(key=_device_order)
    return Shared(
        [
            ResourcePlan(
                name,
                tuple(devices),
                sharing=kind if any(d.shared for d in devices) else SharingKind.NONE,
                fail_requests_greater_than_one=sharing.fail_requests_greater_than_one,
            )
            for name, devices in out.items()
        ],
        sources,
        problems=tuple(problems),
        warnings=tuple(warnings),
        mps=_mps_daemons(out, shares, inventory, config.flags.mps_root),
    )


def _mps_daemons(
    resources: dict[str, list[VirtualDevice]],
    shares: dict[str, _Share],
    inventory: Inventory,
    mps_root: str,
) -> tuple[MpsDaemon, ...]:
    """One control daemon per resource that holds MPS replicas, over their GPUs."""
    daemons = []
    for name in sorted(resources):
        gpus: dict[str, MpsGpu] = {}
        for d in resources[name]:
            share = shares.get(d.physical)
            gpu = inventory.gpu(d.gpu_uuid)
            if share is None or share.mps is None or gpu is None or d.is_mig:
                continue
            gpus.setdefault(
                gpu.uuid,
                MpsGpu(uuid=gpu.uuid, index=gpu.index, memory_mib=gpu.memory_mib, share=share.mps),
            )
        if gpus:
            daemons.append(mps_daemon(name, mps_root=mps_root, gpus=list(gpus.values())))
    return tuple(daemons)
