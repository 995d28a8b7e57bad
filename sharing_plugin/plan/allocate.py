"""Allocate: the IDs kubelet picked for one container -> what the container runtime must inject.

The answer is assembled from small pure fragments (device list as env var or volume mounts, CDI
names and annotations, device nodes, MPS pipe), one per `deviceListStrategy` and flag, merged
once: the reference plugin's helper split without its shared mutable response. Refusals are
`AllocationError`s worded as the reference words them, since they end up in a pod's events.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from sharing_plugin.config.model import (
    DeviceIdStrategy,
    DeviceListStrategy,
    Flags,
    SharingKind,
)
from sharing_plugin.errors import AllocationError
from sharing_plugin.plan.model import (
    ContainerAllocation,
    DeviceSpec,
    Mount,
    ResourcePlan,
    VirtualDevice,
    unique,
)

VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
# volume-mounts: the NVIDIA container runtime reads the device list from the names of files
# mounted under this directory, which unprivileged pods cannot forge through env vars.
VOLUME_MOUNTS_ROOT = "/var/run/nvidia-container-devices"
VOLUME_MOUNTS_HOST_PATH = "/dev/null"
# Control device nodes every CUDA process opens; the reference passes those that exist on the
# host. The adapter filters them by existence once at start and passes the survivors in.
CONTROL_DEVICE_NODES: tuple[str, ...] = (
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
)
CDI_KIND = "nvidia.com/gpu"
# The spec the plugin writes for enforced shares: one device per GPU, named by its UUID, whose
# createRuntime hook applies the container's NVIDIA_GPU_MEMORY_* values to that GPU.
MEMORY_LIMIT_CDI_KIND = "sharing-plugin.io/memory-limit"
MEMORY_REQUEST = "NVIDIA_GPU_MEMORY_REQUEST"
MEMORY_LIMIT = "NVIDIA_GPU_MEMORY_LIMIT"
CDI_ANNOTATION_PLUGIN = "nvidia-device-plugin"
# Where the MPS pipe directory appears inside containers (the reference's mps.ContainerRoot).
MPS_CONTAINER_ROOT = "/mps"
_CDI_STRATEGIES = frozenset({DeviceListStrategy.CDI_ANNOTATIONS, DeviceListStrategy.CDI_CRI})
_MAX_SHOWN = 100  # characters of a requested ID quoted in an error
_RESPONSE_NAMESPACE = uuid.UUID("7b0c5a8e-2f51-4f0e-9d51-6a2f4f3f0c11")


def _join(root: str, path: str) -> str:
    # filepath.Join(root, "/dev/x") in Go keeps both parts; os.path.join would drop the root.
    return root.rstrip("/") + path


def _shown(device_id: str) -> str:
    """An ID from the request as it may appear in an error: the message travels back in gRPC
    trailing metadata (8 KiB by default on kubelet's side) and into our logs, so an ID that is
    long or holds control characters is quoted and cut."""
    if device_id.isprintable() and 0 < len(device_id) <= _MAX_SHOWN:
        return device_id
    if len(device_id) <= _MAX_SHOWN:
        return repr(device_id)
    return f"{device_id[:_MAX_SHOWN]!r}... ({len(device_id)} characters)"


def _validate(resource: ResourcePlan, request_ids: Sequence[str]) -> list[VirtualDevice]:
    devices: list[VirtualDevice] = []
    for device_id in request_ids:
        device = resource.device(device_id)
        if device is None:
            raise AllocationError(
                f'invalid allocation request for "{resource.name}": unknown device: '
                f"{_shown(device_id)}"
            )
        devices.append(device)
    if (
        resource.fail_requests_greater_than_one
        and len(devices) > 1
        and any(d.shared for d in devices)
    ):
        raise AllocationError(
            f'invalid allocation request for "{resource.name}": maximum request size for shared '
            f"resources is 1; found {len(devices)}"
        )
    return devices


def container_ids(devices: Sequence[VirtualDevice], strategy: DeviceIdStrategy) -> list[str]:
    """What the container is told: unique UUIDs (or indexes), in request order."""
    if strategy is DeviceIdStrategy.INDEX:
        return unique(d.index for d in devices)
    return unique(d.physical for d in devices)


def _device_specs(
    devices: Sequence[VirtualDevice], dev_root: str, control_nodes: Sequence[str]
) -> tuple[DeviceSpec, ...]:
    paths = unique([*control_nodes, *(p for d in devices for p in d.paths)])
    return tuple(DeviceSpec(container_path=p, host_path=_join(dev_root, p)) for p in paths)


def _cdi(
    names: list[str], strategies: frozenset[DeviceListStrategy], prefix: str, response_id: str
) -> tuple[dict[str, str], tuple[str, ...]]:
    annotations: dict[str, str] = {}
    cdi_devices: tuple[str, ...] = ()
    if not names:
        return annotations, cdi_devices
    if DeviceListStrategy.CDI_ANNOTATIONS in strategies:
        # The CDI library's UpdateAnnotations key, `<prefix><plugin>_<id>`, with the prefix
        # replaced when the config sets its own (as the reference does).
        annotations[f"{prefix}{CDI_ANNOTATION_PLUGIN}_{response_id}"] = ",".join(names)
    if DeviceListStrategy.CDI_CRI in strategies:
        cdi_devices = tuple(names)
    return annotations, cdi_devices


def memory_limit_cdi_id(gpu_uuid: str) -> str:
    return f"{MEMORY_LIMIT_CDI_KIND}={gpu_uuid}"


def _memory_caps(devices: Sequence[VirtualDevice]) -> tuple[dict[str, str], list[str], str | None]:
    """The env vars and CDI devices that cap the container's memory on its GPUs, and a note.

    Each GPU's limit is the caps of its replicas the container holds, added up. The hook takes
    one value for every GPU it is given, so a container on two GPUs gets the larger."""
    per_gpu: dict[str, int] = {}
    for d in devices:
        if d.memory_cap_mib is not None:
            per_gpu[d.gpu_uuid] = per_gpu.get(d.gpu_uuid, 0) + d.memory_cap_mib
    if not per_gpu:
        return {}, [], None
    limit = max(per_gpu.values())
    note = None
    if len(set(per_gpu.values())) > 1:
        shares = ", ".join(f"{uuid} {mib} MiB" for uuid, mib in per_gpu.items())
        note = (
            f"a container holds shares of different sizes on {len(per_gpu)} GPUs ({shares}): "
            f"the memory hook takes one value, so each GPU is capped at the larger, {limit} MiB"
        )
    value = str(limit)
    envs = {MEMORY_REQUEST: value, MEMORY_LIMIT: value}
    return envs, [memory_limit_cdi_id(uuid) for uuid in per_gpu], note


def mps_pipe_directory(resource_name: str) -> str:
    return f"{MPS_CONTAINER_ROOT}/{resource_name}/pipe"


def _mps_mounts(resource_name: str, mps_root: str) -> tuple[Mount, ...]:
    root = mps_root.rstrip("/")
    return (
        Mount(
            container_path=mps_pipe_directory(resource_name),
            host_path=f"{root}/{resource_name}/pipe",
        ),
        # The MPS control daemon and its clients exchange memory through /dev/shm.
        Mount(container_path="/dev/shm", host_path=f"{root}/shm"),
    )


def allocate(
    resource: ResourcePlan,
    request_ids: Sequence[str],
    flags: Flags,
    *,
    control_nodes: Sequence[str] = CONTROL_DEVICE_NODES,
    response_id: str | None = None,
) -> ContainerAllocation:
    """The answer for one container that kubelet gave `request_ids` of `resource`.

    `control_nodes` are the control device nodes present on the host (passDeviceSpecs);
    `response_id` names the CDI annotation (default: derived from the request, so the same
    request gets the same answer). Raises `AllocationError` for unknown IDs and for more than
    one replica when the resource refuses that.
    """
    devices = _validate(resource, request_ids)
    plugin = flags.plugin
    strategies = frozenset(plugin.device_list_strategy)
    ids = container_ids(devices, plugin.device_id_strategy)

    envs: dict[str, str] = {}
    mounts: list[Mount] = []
    specs: tuple[DeviceSpec, ...] = ()
    cdi_names = [f"{CDI_KIND}={i}" for i in ids]
    if flags.gds_enabled:
        cdi_names.append("nvidia.com/gds=all")
    if flags.mofed_enabled:
        cdi_names.append("nvidia.com/mofed=all")
    annotations: dict[str, str] = {}
    cdi_devices: tuple[str, ...] = ()
    if strategies & _CDI_STRATEGIES:
        rid = response_id or str(uuid.uuid5(_RESPONSE_NAMESPACE, ",".join(request_ids)))
        annotations, cdi_devices = _cdi(cdi_names, strategies, plugin.cdi_annotation_prefix, rid)
    if resource.sharing is SharingKind.MPS:
        envs["CUDA_MPS_PIPE_DIRECTORY"] = mps_pipe_directory(resource.name)
        mounts.extend(_mps_mounts(resource.name, flags.mps_root))
    # With only CDI strategies the runtime learns everything from CDI; the reference adds no
    # env vars, mounts or device nodes then.
    if not strategies <= _CDI_STRATEGIES:
        if DeviceListStrategy.ENVVAR in strategies:
            envs[VISIBLE_DEVICES] = ",".join(ids)
        if DeviceListStrategy.VOLUME_MOUNTS in strategies:
            envs[VISIBLE_DEVICES] = VOLUME_MOUNTS_ROOT
            mounts.extend(
                Mount(container_path=f"{VOLUME_MOUNTS_ROOT}/{i}", host_path=VOLUME_MOUNTS_HOST_PATH)
                for i in ids
            )
        if plugin.pass_device_specs:
            specs = _device_specs(devices, flags.nvidia_dev_root, control_nodes)
        if flags.gds_enabled:
            envs["NVIDIA_GDS"] = "enabled"
        if flags.mofed_enabled:
            envs["NVIDIA_MOFED"] = "enabled"
    # Whatever the strategy: the kubelet hands cdi_devices to the runtime as CRI CDIDevices,
    # and the hook reads the limit from the container's environment.
    cap_envs, cap_devices, note = _memory_caps(devices)
    envs.update(cap_envs)
    return ContainerAllocation(
        envs=envs,
        mounts=tuple(mounts),
        devices=specs,
        annotations=annotations,
        cdi_devices=(*cdi_devices, *cap_devices),
        physical=tuple(unique(d.physical for d in devices)),
        note=note,
    )
