"""MPS control daemons as values: one per MPS resource, over its GPUs, with its client limits.

Each resource shared through MPS gets its own control daemon, with its pipe and log directories
under `flags.mpsRoot/<resource>` (where Allocate mounts the pipe directory from), serving the
GPUs behind the resource in `CUDA_VISIBLE_DEVICES` order. The limits are the reference's
(docs/contract.md, "MPS"): each client may pin GPU memory / replicas of a device (in whole MiB,
as the reference writes `<n>M`) and use 100 / replicas percent of its threads, unless the
sharing entry sets `pinnedMemoryLimit` or `activeThreadPercentage`. MPS has one default thread
percentage per daemon, so a resource whose GPUs have different replica counts gets the
smallest share, the one every client fits in. The pinned memory limit is set per device, by
its ordinal among the daemon's visible devices: that is how MPS numbers devices once
`CUDA_VISIBLE_DEVICES` is set.

`fingerprint` names what a running daemon was started for: the control side restarts a daemon
only when it changes, and adopts one whose fingerprint matches after its own restart.

Multi-user mode (`sharing.mps.multiUser`) is part of what a daemon was started for (`-M` is a
start flag: a running daemon cannot take it up), so it is in the fingerprint; only when on, so
the daemons of configs that never set it keep the fingerprint they were started with.
Without it MPS serves one UID at a time, and pods running as another user cannot use the
resource. With it the pipe directory must be reachable by every UID: its mode says so.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from sharing_plugin.config.model import MpsResource, ReplicatedResource
from sharing_plugin.config.quantity import dump_mib
from sharing_plugin.errors import Problem
from sharing_plugin.gpus.inventory import Gpu

PIPE = "pipe"
LOG = "log"
SHM = "shm"

# Multi-user: clients of any UID connect to the sockets in the pipe directory and the server
# writes beside them, so it is world-writable; sticky, so no client removes another's socket
# (as /tmp). Its parent must be searchable by all. The log directory is written by the server
# MPS starts, which may run as a client's UID. The shared memory directory (mounted at
# /dev/shm in clients) is written by every client, as /dev/shm is.
MULTI_USER_MODES = {PIPE: 0o1777, LOG: 0o1777, SHM: 0o1777}
MULTI_USER_ROOT_MODE = 0o755

# CUDA MPS serves at most 48 clients per GPU from Volta's successors with compute capability 7.5
# on, 16 before (CUDA MPS documentation, "Limitations").
MPS_CLIENTS_NEW = 48
MPS_CLIENTS_OLD = 16


def mps_client_limit(compute_capability: tuple[int, int]) -> int:
    return MPS_CLIENTS_NEW if compute_capability >= (7, 5) else MPS_CLIENTS_OLD


def resource_root(mps_root: str, resource: str) -> str:
    """`<mpsRoot>/<resource>`: the directory holding one resource's pipe and log directories."""
    return f"{mps_root.rstrip('/')}/{resource}"


@dataclass(frozen=True, slots=True)
class MpsShare:
    """What one sharing entry asks of one GPU: its replicas and any explicit limits."""

    replicas: int
    active_thread_percentage: int | None = None
    pinned_memory_mib: int | None = None


@dataclass(frozen=True, slots=True)
class MpsDevice:
    """One GPU under a control daemon, and the memory each of its clients may pin."""

    uuid: str
    index: int  # the GPU's NVML index, for messages
    memory_mib: int
    replicas: int
    pinned_memory_mib: int

    @property
    def pinned_memory_limit(self) -> str:
        """The value `set_default_device_pinned_mem_limit` takes, e.g. ``20480M``."""
        return f"{self.pinned_memory_mib}M"


@dataclass(frozen=True, slots=True)
class MpsDaemon:
    """One MPS control daemon: which resource, which GPUs, which limits, where its pipes are."""

    resource: str
    root: str  # <mpsRoot>/<resource>
    devices: tuple[MpsDevice, ...]
    active_thread_percentage: int
    multi_user: bool = False  # `-M`: clients of every UID share the daemon

    @property
    def pipe_directory(self) -> str:
        return f"{self.root}/{PIPE}"

    @property
    def log_directory(self) -> str:
        return f"{self.root}/{LOG}"

    @property
    def shm_directory(self) -> str:
        """`<mpsRoot>/shm`, which Allocate mounts at /dev/shm: shared by every resource."""
        return f"{self.root[: -len(self.resource) - 1]}/{SHM}"

    @property
    def gpus(self) -> tuple[str, ...]:
        """`CUDA_VISIBLE_DEVICES`, in order: device ordinal i is `gpus[i]`."""
        return tuple(d.uuid for d in self.devices)

    def for_claims(self) -> MpsDaemon:
        """This daemon with no per-client limit of its own (every thread, every device's whole
        memory), for clients that bring their own: in DRA mode each claim's CDI edits set its
        client's limits from what the scheduler granted it."""
        return replace(
            self,
            devices=tuple(replace(d, pinned_memory_mib=d.memory_mib) for d in self.devices),
            active_thread_percentage=100,
        )

    def limits(self) -> dict[str, Any]:
        """The limits as `/status` and the daemon's state file show them."""
        return {
            "activeThreadPercentage": self.active_thread_percentage,
            "pinnedMemoryLimits": {d.uuid: d.pinned_memory_limit for d in self.devices},
        }

    @property
    def fingerprint(self) -> str:
        """Stable across processes: what the daemon was started for (GPUs and limits)."""
        started_for: dict[str, Any] = {"gpus": self.gpus, **self.limits(), "root": self.root}
        if self.multi_user:
            started_for["multiUser"] = True
        text = json.dumps(started_for, sort_keys=True).encode()
        return hashlib.sha256(text).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class MpsGpu:
    """A GPU of an MPS resource, as the sharing step saw it."""

    uuid: str
    index: int
    memory_mib: int
    share: MpsShare


def mps_daemon(
    resource: str, *, mps_root: str, gpus: Sequence[MpsGpu], multi_user: bool = False
) -> MpsDaemon:
    """The control daemon of `resource` over `gpus` (in advertised order), with its limits."""
    devices = tuple(
        MpsDevice(
            uuid=g.uuid,
            index=g.index,
            memory_mib=g.memory_mib,
            replicas=g.share.replicas,
            pinned_memory_mib=(
                g.share.pinned_memory_mib
                if g.share.pinned_memory_mib is not None
                else g.memory_mib // max(1, g.share.replicas)  # 0: refused by the checks
            ),
        )
        for g in gpus
    )
    threads = min(
        (
            g.share.active_thread_percentage
            if g.share.active_thread_percentage is not None
            else max(1, 100 // max(1, g.share.replicas))
            for g in gpus
        ),
        default=100,
    )
    return MpsDaemon(
        resource=resource,
        root=resource_root(mps_root, resource),
        devices=devices,
        active_thread_percentage=threads,
        multi_user=multi_user,
    )


def share_for(entry: ReplicatedResource, gpu: Gpu) -> MpsShare:
    """What `entry` asks of `gpu`: replicas (from memoryPerReplica when set) and limits."""
    if not isinstance(entry, MpsResource):
        return MpsShare(entry.replicas)
    if entry.memory_per_replica is not None:
        room = int(gpu.memory_mib * (entry.oversubscribe or 1))
        return MpsShare(
            replicas=room // entry.memory_per_replica,
            active_thread_percentage=entry.active_thread_percentage,
            pinned_memory_mib=entry.pinned_memory_limit or entry.memory_per_replica,
        )
    return MpsShare(
        replicas=entry.replicas,
        active_thread_percentage=entry.active_thread_percentage,
        pinned_memory_mib=entry.pinned_memory_limit,
    )


def gpu_problems(
    entry: ReplicatedResource, share: MpsShare, gpu: Gpu, path: str
) -> tuple[list[Problem], list[str]]:
    """What is wrong (problems) or risky (warnings) with `share` on `gpu`."""
    by_memory = isinstance(entry, MpsResource) and entry.memory_per_replica is not None
    factor = (entry.oversubscribe if isinstance(entry, MpsResource) else None) or 1
    what = f"GPU {gpu.index} ({gpu.product}, {dump_mib(gpu.memory_mib)})"
    sized_at = f"{path}.memoryPerReplica" if by_memory else f"{path}.replicas"
    if share.replicas < 1:
        return [Problem(sized_at, f"{what} holds no client of this size: lower it")], []
    problems: list[Problem] = []
    limit = mps_client_limit(gpu.compute_capability)
    if share.replicas > limit:
        major, minor = gpu.compute_capability
        fix = f"use at most {limit}"
        if by_memory:
            fix = f"raise it to at least {dump_mib(-(-int(gpu.memory_mib * factor) // limit))}"
        problems.append(
            Problem(
                sized_at,
                f"{share.replicas} replicas exceed the {limit} clients MPS serves on {what} "
                f"(compute capability {major}.{minor}): {fix}",
            )
        )
    pinned = share.pinned_memory_mib or gpu.memory_mib // share.replicas
    pinned_at = f"{path}.pinnedMemoryLimit" if share.pinned_memory_mib is not None else sized_at
    if isinstance(entry, MpsResource) and entry.pinned_memory_limit is not None:
        pinned_at = f"{path}.pinnedMemoryLimit"
    total = pinned * share.replicas
    sums = f"{share.replicas} clients x {dump_mib(pinned)} = {dump_mib(total)}"
    if pinned > gpu.memory_mib:
        problems.append(
            Problem(pinned_at, f"{dump_mib(pinned)} per client is more than all of {what}")
        )
    elif total > gpu.memory_mib * factor:
        allowed = "" if factor == 1 else f" x oversubscribe {factor:g}"
        problems.append(
            Problem(
                pinned_at,
                f"{sums} exceed {what}{allowed}: lower the limit, or allow it with "
                "oversubscribe (a factor, e.g. 1.5)",
            )
        )
    if problems:
        return problems, []
    if total > gpu.memory_mib:
        return [], [
            f"{path}.oversubscribe: {sums} oversubscribe {what}: a client may fail to allocate "
            "memory while the others use all of theirs"
        ]
    return [], []
