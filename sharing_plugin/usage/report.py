"""Who uses each GPU, and how much of it: NVML's processes attributed to pods, against shares.

A process is attributed to a container by the first of these that knows:

1. its cgroup names a pod the API lists on this node: that pod, and the container whose
   runtime ID the cgroup names (empty while the pod's status does not list it yet);
2. otherwise, unless its cgroup shows it outside every pod (a host process), PodResources:
   when exactly one pod holds replicas of the device it runs on, that pod (and its container,
   when only one of its containers holds them);
3. otherwise it is unattributed, reported with its pid.

A container's share of a device is what the replicas it holds there entitle it to: the
device's memory divided by its replicas (a MIG device's own memory), or the MPS client limit
of an MPS resource. Containers holding replicas without running anything are listed too, so
the report shows every holder.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sharing_plugin.gpus.holders import HeldReplica, Holder
from sharing_plugin.gpus.inventory import GpuUuid, Inventory
from sharing_plugin.plan.model import Plan, physical_of
from sharing_plugin.usage.model import (
    CgroupRef,
    ContainerUsage,
    DeviceUsage,
    GpuProcess,
    GpuUsage,
    NvmlUsage,
    PodIdentity,
    ResourceShare,
    UsageSnapshot,
)

MIB = 1 << 20
UNATTRIBUTED = Holder(namespace="", pod="", container="")


@dataclass(frozen=True, slots=True)
class _Device:
    uuid: str
    gpu: GpuUuid
    index: str
    mig: str
    memory: int


def build_report(
    *,
    plan: Plan | None,
    inventory: Inventory,
    nvml: NvmlUsage,
    held: Iterable[HeldReplica] | None,
    cgroups: Mapping[int, CgroupRef | None],
    pods: Mapping[str, PodIdentity] | None,
) -> UsageSnapshot:
    """The node's usage from one NVML pass (see the module doc).

    `held`: PodResources' answer (None when kubelet cannot tell). `cgroups`: pid -> the pod its
    cgroup names, None for a process outside every pod; a pid left out could not be read.
    `pods`: pod UID -> identity (None without the API).
    """
    devices = _devices(inventory)
    shares = _shares(plan, devices)
    caps = _caps(plan)
    replicas = list(held or ())
    held_on: dict[str, list[HeldReplica]] = defaultdict(list)
    for replica in replicas:
        held_on[physical_of(replica.device_id)].append(replica)
    by_uid: dict[str, PodIdentity] = dict(pods or {})

    # device UUID -> holder -> its processes there; unattributed processes by device
    rows: dict[str, dict[Holder, list[GpuProcess]]] = defaultdict(dict)
    unattributed: dict[str, list[GpuProcess]] = defaultdict(list)
    for process in nvml.processes:
        if process.device not in devices:
            continue  # a device the inventory does not know (MIG changed since): next pass
        holder = _attribute(process, held_on.get(process.device, ()), cgroups, by_uid)
        if holder is None:
            unattributed[process.device].append(process)
        else:
            rows[process.device].setdefault(holder, []).append(process)
    for device_uuid, on_device in held_on.items():
        for replica in on_device:
            rows[device_uuid].setdefault(replica.holder, [])
    shares_of: dict[str, list[ResourceShare]] = defaultdict(list)
    for (uuid, resource), (count, share) in sorted(shares.items()):
        shares_of[uuid].append(ResourceShare(resource, count, share))

    memory = {m.gpu: m for m in nvml.memory}
    gpus = []
    for gpu in inventory.gpus:
        device_rows = []
        sampled = gpu.uuid in nvml.sampled
        for device in _devices_of(gpu.uuid, devices):
            mine: dict[Holder, list[HeldReplica]] = defaultdict(list)
            for replica in held_on.get(device.uuid, ()):
                mine[replica.holder].append(replica)
            containers = sorted(
                (
                    _container(
                        device, holder, processes, mine.get(holder, ()), shares, sampled, caps
                    )
                    for holder, processes in rows.get(device.uuid, {}).items()
                ),
                key=lambda c: (c.holder.namespace, c.holder.pod, c.holder.container),
            )
            for process in sorted(unattributed.get(device.uuid, ()), key=lambda p: p.pid):
                containers.append(
                    _container(device, UNATTRIBUTED, [process], (), shares, sampled, caps)
                )
            device_shares = tuple(shares_of.get(device.uuid, ()))
            if not device_shares and not containers:
                continue
            used = (
                memory[gpu.uuid].used
                if device.uuid == gpu.uuid and gpu.uuid in memory
                else sum(c.memory for c in containers)
            )
            device_rows.append(
                DeviceUsage(
                    uuid=device.uuid,
                    gpu=gpu.uuid,
                    index=device.index,
                    mig=device.mig,
                    memory_total=device.memory,
                    memory_used=used,
                    shares=device_shares,
                    containers=tuple(containers),
                )
            )
        gpu_memory = memory.get(gpu.uuid)
        gpus.append(
            GpuUsage(
                uuid=gpu.uuid,
                index=gpu.index,
                product=gpu.product,
                memory_total=gpu_memory.total if gpu_memory else gpu.memory_mib * MIB,
                memory_used=gpu_memory.used if gpu_memory else 0,
                devices=tuple(device_rows),
            )
        )
    return UsageSnapshot(gpus=tuple(gpus), utilization=bool(nvml.sampled), problems=nvml.problems)


def _attribute(
    process: GpuProcess,
    holders: Iterable[HeldReplica],
    cgroups: Mapping[int, CgroupRef | None],
    pods: Mapping[str, PodIdentity],
) -> Holder | None:
    readable = process.pid in cgroups
    ref = cgroups.get(process.pid)
    if readable and ref is None:
        return None  # outside every pod: nothing kubelet gave out
    if ref is not None and ref.pod_uid in pods:
        identity = pods[ref.pod_uid]
        name = identity.containers.get(ref.container_id or "", "")
        return Holder(namespace=identity.namespace, pod=identity.name, container=name)
    by_pod: dict[tuple[str, str], set[str]] = defaultdict(set)
    for replica in holders:
        by_pod[replica.holder.pod_key].add(replica.holder.container)
    if len(by_pod) != 1:
        return None
    (((namespace, pod), containers),) = by_pod.items()
    container = next(iter(containers)) if len(containers) == 1 else ""
    return Holder(namespace=namespace, pod=pod, container=container)


def _container(
    device: _Device,
    holder: Holder,
    processes: list[GpuProcess],
    held: Iterable[HeldReplica],
    shares: Mapping[tuple[str, str], tuple[int, int]],
    sampled: bool,
    caps: Mapping[str, int],
) -> ContainerUsage:
    """`held`: the replicas `holder` holds on the device; `caps`: device ID -> its cap."""
    mine = sorted(held, key=lambda r: r.device_id) if holder.pod else []
    capped = [caps[r.device_id] for r in mine if r.device_id in caps]
    resources = sorted({r.resource for r in mine})
    share = sum(shares.get((device.uuid, r.resource), (0, 0))[1] for r in mine)
    known = [p.sm for p in processes if p.sm is not None]
    sm: float | None = sum(known) if known else (0.0 if sampled else None)
    return ContainerUsage(
        holder=holder,
        resource=resources[0] if resources else "",
        device=device.uuid,
        gpu=device.gpu,
        mig=device.mig,
        replicas=tuple(r.device_id for r in mine),
        memory=sum(p.memory or 0 for p in processes),
        share=share,
        sm=min(sm, 1.0) if sm is not None else None,
        pids=tuple(sorted(p.pid for p in processes)),
        cap=sum(capped) if capped else None,
    )


def _caps(plan: Plan | None) -> dict[str, int]:
    """Advertised ID -> the bytes the driver caps that replica at (only capped replicas)."""
    if plan is None:
        return {}
    return {
        d.id: d.memory_cap_mib * MIB
        for r in plan.resources
        for d in r.devices
        if d.memory_cap_mib is not None
    }


def _devices(inventory: Inventory) -> dict[str, _Device]:
    """Every GPU and MIG device of the node, by UUID."""
    out: dict[str, _Device] = {}
    for gpu in inventory.gpus:
        out[gpu.uuid] = _Device(gpu.uuid, gpu.uuid, str(gpu.index), "", gpu.memory_mib * MIB)
        for mig in gpu.mig_devices:
            out[mig.uuid] = _Device(
                mig.uuid, gpu.uuid, f"{gpu.index}:{mig.index}", mig.profile, mig.memory_mib * MIB
            )
    return out


def _devices_of(gpu: GpuUuid, devices: Mapping[str, _Device]) -> list[_Device]:
    """The GPU, then its MIG devices in index order (`devices` is built so)."""
    return [d for d in devices.values() if d.gpu == gpu]


def _shares(
    plan: Plan | None, devices: Mapping[str, _Device]
) -> dict[tuple[str, str], tuple[int, int]]:
    """(device UUID, resource) -> (replicas, bytes each replica is entitled to)."""
    if plan is None:
        return {}
    pinned = {
        (daemon.resource, device.uuid): device.pinned_memory_mib * MIB
        for daemon in plan.mps
        for device in daemon.devices
    }
    out: dict[tuple[str, str], tuple[int, int]] = {}
    for resource in plan.resources:
        for physical, count in resource.replicas_by_physical().items():
            device = devices.get(physical)
            if device is None:
                continue
            share = pinned.get((resource.name, physical), device.memory // count)
            out[(physical, resource.name)] = (count, share)
    return out
