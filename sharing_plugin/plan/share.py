"""Sharing: selected devices become replicas, under their own name or a new one.

Each `sharing.*.resources` entry selects devices of one resource; each selected device becomes
`replicas` virtual devices `<uuid>::0 … <uuid>::<replicas-1>` (the reference's numbering, so
raising replicas keeps the existing IDs). Several entries for one name give different replica
counts per GPU; a device may be selected by one entry only. Devices no entry selects stay under
their original name, unshared. An entry sized by `memoryPerReplica` gets as many replicas as
each device's memory holds; with `memoryLimits` on, each replica of a whole GPU carries its
memory cap (`memoryPerReplica`, the MPS client limit, else the GPU's memory over its replicas).
MIG replicas carry none: NVML caps whole GPUs only, and a MIG device is isolated already.
"""

from __future__ import annotations

from dataclasses import dataclass

from sharing_plugin.config.advice import MIG_REPLICAS_UNCAPPED, MIG_RESOURCE_PREFIX
from sharing_plugin.config.model import (
    MAX_DEVICES_PER_RESOURCE,
    Config,
    ReplicatedResource,
    SharingKind,
)
from sharing_plugin.config.quantity import dump_mib
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
from sharing_plugin.plan.select import BaseDevices, DeviceSelector, Found, describe

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


@dataclass(frozen=True, slots=True)
class _Share:
    target: str
    replicas: int
    path: str
    mps: MpsShare | None = None
    cap_mib: int | None = None  # each replica's memory cap, where memoryLimits asks for one


def _device_order(device: VirtualDevice) -> tuple[int, int, int]:
    gpu, _, mig = device.index.partition(":")
    return int(gpu), int(mig) if mig else -1, device.replica if device.replica is not None else -1


def _replica(device: VirtualDevice, n: int, share: _Share) -> VirtualDevice:
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
        replicas=share.replicas,
        is_mig=device.is_mig,
        compute_capability=device.compute_capability,
        memory_cap_mib=share.cap_mib,
    )


def _mps_problems(
    entry: ReplicatedResource, selected: list[VirtualDevice], inventory: Inventory, path: str
) -> Found:
    """What is wrong with sharing `selected` by MPS (`devices` stays empty)."""
    problems: list[Problem] = []
    warnings: list[str] = []
    migs = [d for d in selected if d.is_mig]
    if migs:
        listed = ", ".join(describe(d) for d in migs[:4]) + (" …" if len(migs) > 4 else "")
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
    return Found([], problems, warnings)


def _memory_mib(device: VirtualDevice, inventory: Inventory) -> int:
    """The memory behind `device`: its MIG device's, else its GPU's (0 where unknown)."""
    if device.is_mig:
        mig = inventory.mig_device(device.physical)
        return mig.memory_mib if mig is not None else 0
    gpu = inventory.gpu(device.gpu_uuid)
    return gpu.memory_mib if gpu is not None else 0


def _no_replica_fits(device: VirtualDevice, memory_mib: int, path: str) -> Problem:
    return Problem(
        path,
        f"{describe(device)} has {dump_mib(memory_mib)}: not one replica of this size fits; "
        "lower it",
    )


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
    selector = DeviceSelector(inventory, base)
    shares: dict[str, _Share] = {}
    sources: dict[str, str] = {}
    uncapped: set[str] = set()  # entries whose MIG replicas memoryLimits cannot cap
    unfit: set[tuple[bool, int]] = set()  # (MIG?, memory) found too small: one report each
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
                        f"{describe(d)} is already shared by {earlier.path}: a device can be "
                        "shared by one entry only; remove it from one of them",
                    )
                )
                continue
            gpu = inventory.gpu(d.gpu_uuid)
            memory = _memory_mib(d, inventory)
            mps = share_for(entry, gpu) if kind is SharingKind.MPS and gpu is not None else None
            if mps is not None:
                replicas, per_replica = mps.replicas, mps.pinned_memory_mib
            elif entry.memory_per_replica is not None:
                replicas, per_replica = memory // entry.memory_per_replica, entry.memory_per_replica
                if replicas < 1:
                    if (d.is_mig, memory) not in unfit:
                        unfit.add((d.is_mig, memory))
                        problems.append(_no_replica_fits(d, memory, f"{path}.memoryPerReplica"))
                    continue
            else:
                replicas, per_replica = entry.replicas, None
            replicas = max(replicas, 1)
            cap = None
            if config.memory_limits.on and not d.is_mig and memory:
                cap = per_replica if per_replica is not None else memory // replicas
            elif config.memory_limits.on and d.is_mig and path not in uncapped:
                uncapped.add(path)  # the config's own warning says it for mig-* names
                if not entry.name.startswith(MIG_RESOURCE_PREFIX):
                    warnings.append(MIG_REPLICAS_UNCAPPED.format(path=path))
            shares[d.physical] = _Share(target, replicas, path, mps=mps, cap_mib=cap)

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
                bucket.extend(_replica(d, n, share) for n in range(share.replicas))
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
        mps=_mps_daemons(
            out,
            shares,
            inventory,
            config.flags.mps_root,
            multi_user=config.sharing.mps is not None and config.sharing.mps.multi_user,
        ),
    )


def _mps_daemons(
    resources: dict[str, list[VirtualDevice]],
    shares: dict[str, _Share],
    inventory: Inventory,
    mps_root: str,
    *,
    multi_user: bool,
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
            daemons.append(
                mps_daemon(name, mps_root=mps_root, gpus=list(gpus.values()), multi_user=multi_user)
            )
    return tuple(daemons)
