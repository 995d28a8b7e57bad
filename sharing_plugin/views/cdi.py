"""The CDI spec of one prepared ResourceClaim: what the container runtime injects for its devices.

The DRA plugin answers NodePrepareResources with CDI device IDs; the container runtime resolves
them from spec files the plugin wrote (docs/contract.md, "DRA mode"). Each claim gets its own
spec (kind `<driver>/claim`, one CDI device per prepared device, named `<claim uid>-<device>`),
so unpreparing a claim is deleting one file and claims never share an entry.

The edits are what the device plugin's Allocate answers for the envvar strategy, from the same
pure `allocate`: `NVIDIA_VISIBLE_DEVICES` with the claim's unique physical UUIDs (or indexes under
`deviceIDStrategy: index`) in request order, and for MPS the pipe directory env var and mounts.
Every device of the claim carries the whole claim's list: the runtime merges the edits of the
devices it injects by env name, so whichever it applies last must say the same thing.

An MPS device published by capacity is shared by as many clients as its memory holds shares,
each granted its own amount by the scheduler: the claim's edits then set that client's MPS
limits from what it consumes (`consumedCapacity.memory`), so MPS enforces what was granted:
`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` (`<ordinal>=<MiB>M` for each such device, by its ordinal
among the claim's visible devices) and `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` (the claim's share of
the device's memory as its share of threads; the smallest where it has several).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from sharing_plugin.config.model import DeviceListStrategy, Flags, SharingKind
from sharing_plugin.plan.allocate import (
    MEMORY_LIMIT,
    MEMORY_REQUEST,
    VISIBLE_DEVICES,
    allocate,
    container_ids,
)
from sharing_plugin.plan.model import Mount, Plan, ResourcePlan, unique
from sharing_plugin.views.cdi_memory import memory_hook
from sharing_plugin.views.dra import DraDevice

CDI_VERSION: Final = "0.5.0"  # env and mounts only: understood by every CDI-aware runtime
CDI_CLASS: Final = "claim"
MPS_PINNED_LIMIT: Final = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
MPS_THREADS: Final = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"


def cdi_kind(driver: str) -> str:
    return f"{driver}/{CDI_CLASS}"


def cdi_device_name(claim_uid: str, device_name: str) -> str:
    return f"{claim_uid}-{device_name}"


def cdi_id(driver: str, claim_uid: str, device_name: str) -> str:
    """The fully qualified CDI device name the runtime looks up: `<driver>/claim=<uid>-<device>`."""
    return f"{cdi_kind(driver)}={cdi_device_name(claim_uid, device_name)}"


def spec_file_name(driver: str, claim_uid: str) -> str:
    """The claim's spec file name, as the CDI library names transient specs."""
    return f"{driver}-{CDI_CLASS}_{claim_uid}.json"


def _envvar_flags(flags: Flags) -> Flags:
    plugin = flags.plugin.model_copy(update={"device_list_strategy": (DeviceListStrategy.ENVVAR,)})
    return flags.model_copy(update={"plugin": plugin})


def _mount(mount: Mount) -> dict[str, Any]:
    return {
        "hostPath": mount.host_path,
        "containerPath": mount.container_path,
        "options": ["ro" if mount.read_only else "rw", "nosuid", "nodev", "bind"],
    }


def claim_spec(
    *,
    driver: str,
    claim_uid: str,
    devices: Sequence[DraDevice],
    plan: Plan,
    flags: Flags,
    consumed_mib: Mapping[str, int] | None = None,
    memory_hook_path: str | None = None,
) -> dict[str, Any]:
    """The CDI spec for a claim that was allocated `devices` (in the claim's result order);
    `consumed_mib` is the memory it consumes of each device published by capacity, by name;
    `memory_hook_path` the toolkit's CDI hook where shares are capped (`memoryLimits`).

    Raises `AllocationError` where Allocate would refuse the same devices (a resource with
    `failRequestsGreaterThanOne` and more than one of its replicas in one claim).
    """
    envvar = _envvar_flags(flags)
    by_resource: dict[str, list[DraDevice]] = {}
    for d in devices:
        by_resource.setdefault(d.resource, []).append(d)
    extra: dict[str, tuple[dict[str, str], tuple[Mount, ...]]] = {}
    for name, group in by_resource.items():
        resource = plan.resource(name) or ResourcePlan(name=name, devices=())
        known = ResourcePlan(
            name=name,
            devices=tuple(d.device for d in group),
            sharing=resource.sharing,
            fail_requests_greater_than_one=resource.fail_requests_greater_than_one,
        )
        answer = allocate(known, [d.device.id for d in group], envvar)
        envs = {k: v for k, v in answer.envs.items() if k != VISIBLE_DEVICES}
        extra[name] = (envs, answer.mounts)
    ids = unique(container_ids([d.device for d in devices], flags.plugin.device_id_strategy))
    limits = _mps_limits(devices, ids, flags, consumed_mib or {})
    caps = _memory_caps(devices, consumed_mib or {}) if memory_hook_path is not None else {}
    if caps:  # one value for every GPU, as the hook takes it: the larger
        limits[MEMORY_REQUEST] = limits[MEMORY_LIMIT] = str(max(caps.values()))
    cdi_devices = []
    for d in devices:
        envs, mounts = extra[d.resource]
        envs = {k: v for k, v in envs.items() if k not in (MEMORY_REQUEST, MEMORY_LIMIT)}
        edits: dict[str, Any] = {
            "env": [
                f"{VISIBLE_DEVICES}={','.join(ids)}",
                *(f"{k}={v}" for k, v in {**envs, **limits}.items()),
            ]
        }
        if mounts:
            edits["mounts"] = [_mount(m) for m in mounts]
        if memory_hook_path is not None and d.gpu_uuid in caps:
            hook = memory_hook(
                hook_path=memory_hook_path,
                gpu_uuid=d.gpu_uuid,
                driver_root=flags.nvidia_driver_root,
            )
            edits["hooks"] = [hook]
        cdi_devices.append({"name": cdi_device_name(claim_uid, d.name), "containerEdits": edits})
    return {"cdiVersion": CDI_VERSION, "kind": cdi_kind(driver), "devices": cdi_devices}


def _memory_caps(devices: Sequence[DraDevice], consumed: Mapping[str, int]) -> dict[str, int]:
    """GPU UUID -> the claim's memory cap there: what it consumes of a device published by
    capacity, else the caps of the replicas it holds (replica model); none on MIG devices or on
    GPUs that do not enforce (their devices carry no cap)."""
    caps: dict[str, int] = {}
    for d in devices:
        if d.device.memory_cap_mib is None:
            continue
        mib = consumed.get(d.name) if d.shares is not None else None
        caps[d.gpu_uuid] = caps.get(d.gpu_uuid, 0) + (mib or d.device.memory_cap_mib)
    return caps


def _mps_limits(
    devices: Sequence[DraDevice], ids: Sequence[str], flags: Flags, consumed: Mapping[str, int]
) -> dict[str, str]:
    """The MPS client limits of a claim's MPS devices published by capacity (module doc)."""
    pinned: list[str] = []
    percents: list[int] = []
    for d in devices:
        mib = consumed.get(d.name)
        if d.shares is None or d.sharing != SharingKind.MPS.value or mib is None:
            continue
        (own,) = container_ids([d.device], flags.plugin.device_id_strategy)
        pinned.append(f"{ids.index(own)}={mib}M")
        percents.append(max(1, min(100, mib * 100 // max(d.memory_mib, 1))))
    if not pinned:
        return {}
    return {MPS_PINNED_LIMIT: ",".join(pinned), MPS_THREADS: str(min(percents))}
