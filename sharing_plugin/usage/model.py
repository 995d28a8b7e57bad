"""The values per-pod GPU usage is computed from and into; frozen, no I/O.

What the node says (NVML's processes and memory, each process's cgroup, the pods the API
lists, what PodResources says pods hold) comes in as these values; `usage.report` turns them
into a `UsageSnapshot`, which the metrics, `/status` and over-share detection read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sharing_plugin.gpus.holders import Holder
from sharing_plugin.gpus.inventory import GpuUuid


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """One process with a compute context on a GPU or MIG device, as NVML lists it."""

    pid: int
    device: str  # UUID of the GPU or MIG device it runs on
    gpu: GpuUuid  # the physical GPU (the device itself for a whole GPU)
    memory: int | None  # GPU memory it uses, bytes; None where NVML cannot tell
    sm: float | None  # SM utilization over NVML's last samples, 0..1; None: not known


@dataclass(frozen=True, slots=True)
class DeviceMemory:
    """Memory of one GPU as NVML counts it (bytes): used includes what no listed process owns."""

    gpu: GpuUuid
    total: int
    used: int


@dataclass(frozen=True, slots=True)
class NvmlUsage:
    """One pass over the node's GPUs: every process, every GPU's memory, what did not answer."""

    processes: tuple[GpuProcess, ...] = ()
    memory: tuple[DeviceMemory, ...] = ()
    problems: tuple[str, ...] = ()
    # GPUs that answered per-process utilization: a process there without a sample was idle
    sampled: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class CgroupRef:
    """Whose cgroup a process lives in: a pod's (by UID) and, when the path says, a container's."""

    pod_uid: str  # lower case, with dashes: as metadata.uid reads
    container_id: str | None  # the runtime's ID (64 hex digits), without a `containerd://` prefix
    # The cgroup v2 path (`0::<path>`) as read, "" on cgroup v1: the namespace NVML caps memory
    # on. Not part of the identity: the same container whatever the path reads.
    path: str = field(default="", compare=False)


@dataclass(frozen=True, slots=True)
class PodIdentity:
    """A pod on this node, as the API lists it."""

    namespace: str
    name: str
    uid: str
    containers: Mapping[str, str] = field(default_factory=dict)  # container ID -> name


@dataclass(frozen=True, slots=True)
class ContainerUsage:
    """What one container uses of one device, and what it is entitled to there.

    `share` is the memory of the replicas it holds on the device (each the device's memory
    over its replicas, or the MPS client limit); a container that uses a device it holds
    nothing of has a share of 0. An unattributed process has an empty holder and its pid.
    """

    holder: Holder
    resource: str  # the resource its replicas on the device are of; "" when it holds none
    device: str  # GPU or MIG device UUID
    gpu: GpuUuid
    mig: str  # MIG profile, "" for a whole GPU
    replicas: tuple[str, ...]  # advertised IDs it holds on the device
    memory: int  # bytes its processes use there
    share: int  # bytes its replicas entitle it to
    sm: float | None  # summed SM utilization of its processes, 0..1; None: not known
    pids: tuple[int, ...]
    cap: int | None = None  # bytes the driver caps it at there (memoryLimits): its replicas' caps

    @property
    def attributed(self) -> bool:
        return bool(self.holder.pod)


@dataclass(frozen=True, slots=True)
class ResourceShare:
    """How one resource shares one device."""

    resource: str
    replicas: int
    share: int  # bytes each replica is entitled to


@dataclass(frozen=True, slots=True)
class DeviceUsage:
    """One GPU or MIG device that backs an advertised resource, and who uses it."""

    uuid: str
    gpu: GpuUuid
    index: str  # "0" for a GPU, "0:1" for MIG device 1 on GPU 0 (as nvidia-smi numbers them)
    mig: str
    memory_total: int
    memory_used: int
    shares: tuple[ResourceShare, ...]
    containers: tuple[ContainerUsage, ...]  # holders and users, attributed ones first

    @property
    def shared(self) -> bool:
        return any(s.replicas > 1 for s in self.shares)


@dataclass(frozen=True, slots=True)
class GpuUsage:
    """One physical GPU: its memory as NVML counts it, and its devices."""

    uuid: GpuUuid
    index: int
    product: str
    memory_total: int
    memory_used: int
    devices: tuple[DeviceUsage, ...]


@dataclass(frozen=True, slots=True)
class UsageSnapshot:
    """The node's GPU usage at one moment."""

    gpus: tuple[GpuUsage, ...] = ()
    utilization: bool = False  # whether any GPU answered per-process utilization
    problems: tuple[str, ...] = ()

    def containers(self) -> list[ContainerUsage]:
        return [c for g in self.gpus for d in g.devices for c in d.containers]

    def devices(self) -> list[DeviceUsage]:
        return [d for g in self.gpus for d in g.devices]

    @property
    def shared_in_use(self) -> bool:
        """Whether a pod holds or uses a shared device: what over-share detection has to keep
        looking at (an unattributed process has no share to be over)."""
        return any(d.shared and any(c.attributed for c in d.containers) for d in self.devices())
