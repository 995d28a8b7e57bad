"""The NVML adapter: what the node's GPUs are, read through pynvml into an `Inventory`.

The pynvml module is a parameter (`nvml`), never imported state: the entry point hands in the
real `pynvml` for ``--gpus nvml`` and the simulator for ``simulated:...``, and the same code
below runs against either. A GPU that does not answer is reported in the inventory (unhealthy,
with NVML's words) rather than aborting discovery, unless `fail_on_init_error` asks for that,
which mirrors the reference plugin's ``failOnInitError``.
"""

from __future__ import annotations

import logging
from contextlib import suppress
from dataclasses import replace
from itertools import combinations

from sharing_plugin.errors import NvmlError
from sharing_plugin.gpus.catalog import model_for
from sharing_plugin.gpus.inventory import (
    Gpu,
    GpuLink,
    GpuUuid,
    Inventory,
    MigDevice,
    MigPlacement,
    MigUuid,
    Topology,
    extended_bdf,
)
from sharing_plugin.nvml.api import DeviceHandle, GpuInstanceProfileInfo, NvmlApi
from sharing_plugin.nvml.calls import is_code, nvml_errors, nvml_session, text
from sharing_plugin.nvml.identity import PcieRoots, architecture, brand, pcie_roots_for

log = logging.getLogger(__name__)

_NVLINK_DEVICE_TYPE_SWITCH = 2  # nvmlIntNvLinkDeviceType_t: NVML_NVLINK_DEVICE_TYPE_SWITCH


def discover(nvml: NvmlApi, *, fail_on_init_error: bool = False) -> Inventory:
    """Read every GPU, its MIG devices and the links between GPUs.

    Without `fail_on_init_error`, a node where NVML cannot start gives an empty inventory with a
    warning (as the reference plugin keeps running on nodes without GPUs), and a GPU that fails
    to answer gives a `Gpu` with ``healthy_at_discovery=False``; with it, both raise `NvmlError`.
    """
    try:
        with nvml_errors(nvml, "initialising NVML"):
            nvml.nvmlInit()
    except NvmlError as exc:
        if fail_on_init_error:
            raise
        log.warning("%s", exc)
        return Inventory(gpus=(), warnings=(f"{exc}: no GPUs are advertised",))
    try:
        return _discover(nvml, fail_on_init_error=fail_on_init_error)
    finally:
        with nvml_errors(nvml, "shutting NVML down"):
            nvml.nvmlShutdown()


def _discover(nvml: NvmlApi, *, fail_on_init_error: bool) -> Inventory:
    with nvml_errors(nvml, "reading the driver version"):
        driver = text(nvml.nvmlSystemGetDriverVersion())
        cuda = int(nvml.nvmlSystemGetCudaDriverVersion())
    with nvml_errors(nvml, "counting GPUs"):
        count = int(nvml.nvmlDeviceGetCount())
    gpus: list[Gpu] = []
    handles: dict[int, DeviceHandle] = {}
    # A simulated node says what it could not model (a product missing from the catalog is
    # simulated without MIG); the real pynvml module has no such attribute.
    described = getattr(nvml, "warnings", ())
    warnings = [w for w in described if isinstance(w, str)] if isinstance(described, tuple) else []
    for index in range(count):
        try:
            with nvml_errors(nvml, f"GPU {index}: getting its handle"):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
            gpu = _read_gpu(nvml, index, handle)
            handles[index] = handle
        except NvmlError as exc:
            if fail_on_init_error:
                raise
            gpu = _unanswered_gpu(nvml, index, str(exc))
            warnings.append(f"{exc}: GPU {index} is reported unhealthy")
        gpus.append(gpu)
    links = _links(nvml, gpus, handles)
    gpus = _with_pcie_roots(gpus, pcie_roots_for(nvml))
    return Inventory(
        gpus=tuple(gpus),
        links=links,
        driver_version=driver,
        cuda_driver_version=cuda,
        warnings=tuple(warnings),
    )


def _read_gpu(nvml: NvmlApi, index: int, handle: DeviceHandle) -> Gpu:
    where = f"GPU {index}"
    with nvml_errors(nvml, f"{where}: reading its identity"):
        uuid = GpuUuid(text(nvml.nvmlDeviceGetUUID(handle)))
        product = text(nvml.nvmlDeviceGetName(handle))
        memory_mib = int(nvml.nvmlDeviceGetMemoryInfo(handle).total) >> 20
        minor = int(nvml.nvmlDeviceGetMinorNumber(handle))
        bus_id = text(nvml.nvmlDeviceGetPciInfo(handle).busId)
        major, minor_cc = nvml.nvmlDeviceGetCudaComputeCapability(handle)
    where = f"GPU {index} ({uuid})"
    numa = _numa_node(nvml, handle, where)
    capability = (int(major), int(minor_cc))
    arch = architecture(nvml, handle, capability, where)
    made_by = brand(nvml, handle, where)
    capable, current, pending = _mig_mode(nvml, handle, where)
    mig_devices: tuple[MigDevice, ...] = ()
    if current:
        mig_devices = _mig_devices(
            nvml, handle, parent_uuid=uuid, parent_index=index, product=product
        )
    return Gpu(
        index=index,
        uuid=uuid,
        product=product,
        memory_mib=memory_mib,
        minor=minor,
        pci_bus_id=bus_id,
        numa_node=numa,
        compute_capability=capability,
        mig_capable=capable,
        mig_enabled=current,
        mig_pending=pending,
        mig_devices=mig_devices,
        architecture=arch,
        brand=made_by,
    )


def _with_pcie_roots(gpus: list[Gpu], roots: PcieRoots) -> list[Gpu]:
    """The GPUs with the root complex above each, where it can be told."""
    found = []
    for gpu in gpus:
        bus = extended_bdf(gpu.pci_bus_id)
        root = roots.pcie_root(bus) if bus else None
        found.append(replace(gpu, pcie_root=root) if root else gpu)
    return found


def _unanswered_gpu(nvml: NvmlApi, index: int, problem: str) -> Gpu:
    """What can still be said about a GPU that failed discovery (its UUID, if it answers that)."""
    uuid = GpuUuid(f"GPU-unavailable-{index}")
    with suppress(nvml.NVMLError):
        uuid = GpuUuid(text(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(index))))
    return Gpu(
        index=index,
        uuid=uuid,
        product="unknown",
        memory_mib=0,
        minor=index,
        pci_bus_id="",
        numa_node=None,
        compute_capability=(0, 0),
        healthy_at_discovery=False,
        problem=problem,
    )


def _numa_node(nvml: NvmlApi, handle: DeviceHandle, where: str) -> int | None:
    try:
        node = int(nvml.nvmlDeviceGetNumaNodeId(handle))
    except nvml.NVMLError as exc:
        # Single-socket systems and drivers before R545 have no NUMA answer: not an error.
        if is_code(exc, nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_FUNCTION_NOT_FOUND):
            return None
        with nvml_errors(nvml, f"{where}: reading its NUMA node"):
            raise
    return node if node >= 0 else None


def _mig_mode(nvml: NvmlApi, handle: DeviceHandle, where: str) -> tuple[bool, bool, bool]:
    """(MIG capable, current mode, pending mode)."""
    try:
        current, pending = nvml.nvmlDeviceGetMigMode(handle)
    except nvml.NVMLError as exc:
        if is_code(exc, nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_FUNCTION_NOT_FOUND):
            return False, False, False
        with nvml_errors(nvml, f"{where}: reading its MIG mode"):
            raise
    enabled = int(nvml.NVML_DEVICE_MIG_ENABLE)
    return True, int(current) == enabled, int(pending) == enabled


def gi_profiles(
    nvml: NvmlApi, handle: DeviceHandle
) -> dict[int, tuple[int, GpuInstanceProfileInfo]]:
    """NVML's GPU-instance profiles of one GPU: profile info id -> (profile index, info).

    GPU-instance info names its profile by the per-GPU *id* (19 for 1g.5gb on an A100), not
    by the ``NVML_GPU_INSTANCE_PROFILE_*`` index the catalog uses, so both are collected here.
    """
    found: dict[int, tuple[int, GpuInstanceProfileInfo]] = {}
    for index in range(int(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT)):
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, index)
        except nvml.NVMLError as exc:
            if is_code(exc, nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_INVALID_ARGUMENT):
                continue
            raise
        found[int(info.id)] = (index, info)
    return found


def profile_name(product: str, index: int, info: GpuInstanceProfileInfo) -> str:
    """Canonical profile name: the catalog's for a known model, else NVML's own."""
    model = model_for(product)
    spec = model.mig.profile_by_id(index) if model is not None and model.mig else None
    if spec is not None:
        return spec.name
    name = text(info.name).removeprefix("MIG ").strip()
    return name or f"{int(info.sliceCount)}g.{round(int(info.memorySizeMB) / 1024)}gb"


def read_mig_devices(
    nvml: NvmlApi, gpu_uuid: str, *, parent_index: int, product: str
) -> tuple[MigDevice, ...]:
    """One GPU's MIG devices as they are now, in a session of its own: what a change made to
    one GPU left there, without reading the whole node again."""
    with nvml_session(nvml):
        with nvml_errors(nvml, f"GPU {gpu_uuid}: getting its handle"):
            handle = nvml.nvmlDeviceGetHandleByUUID(gpu_uuid)
        return _mig_devices(
            nvml, handle, parent_uuid=GpuUuid(gpu_uuid), parent_index=parent_index, product=product
        )


def _mig_devices(
    nvml: NvmlApi, handle: DeviceHandle, *, parent_uuid: GpuUuid, parent_index: int, product: str
) -> tuple[MigDevice, ...]:
    where = f"GPU {parent_index} ({parent_uuid})"
    with nvml_errors(nvml, f"{where}: listing MIG profiles"):
        profiles = gi_profiles(nvml, handle)
        slots = int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))
    devices: list[MigDevice] = []
    for slot in range(slots):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except nvml.NVMLError as exc:
            # Slots are not dense on every driver: an empty one answers NOT_FOUND.
            if is_code(exc, nvml.NVML_ERROR_NOT_FOUND, nvml.NVML_ERROR_INVALID_ARGUMENT):
                continue
            with nvml_errors(nvml, f"{where}: reading MIG device {slot}"):
                raise
        with nvml_errors(nvml, f"{where}: reading MIG device {slot}"):
            gi_id = int(nvml.nvmlDeviceGetGpuInstanceId(mig))
            ci_id = int(nvml.nvmlDeviceGetComputeInstanceId(mig))
            info = nvml.nvmlGpuInstanceGetInfo(nvml.nvmlDeviceGetGpuInstanceById(handle, gi_id))
            uuid = MigUuid(text(nvml.nvmlDeviceGetUUID(mig)))
        if int(info.profileId) not in profiles:
            raise NvmlError(
                f"{where}: MIG device {uuid} has GPU-instance profile id {info.profileId}, "
                "which the GPU does not list among its profiles"
            )
        profile_index, profile = profiles[int(info.profileId)]
        devices.append(
            MigDevice(
                uuid=uuid,
                parent_uuid=parent_uuid,
                parent_index=parent_index,
                index=slot,
                gi_id=gi_id,
                ci_id=ci_id,
                profile=profile_name(product, profile_index, profile),
                gi_profile_id=profile_index,
                placement=MigPlacement(int(info.placement.start), int(info.placement.size)),
                memory_mib=int(profile.memorySizeMB),
                sm_count=int(profile.multiprocessorCount),
            )
        )
    return tuple(devices)


def _links(nvml: NvmlApi, gpus: list[Gpu], handles: dict[int, DeviceHandle]) -> tuple[GpuLink, ...]:
    """NVLink counts and PCIe topology for every pair of GPUs that answered."""
    by_bus = {_bus_key(g.pci_bus_id): g.index for g in gpus if g.pci_bus_id}
    direct: dict[tuple[int, int], int] = {}
    switch_links: dict[int, int] = {}
    for index, handle in handles.items():
        for peer in _nvlink_peers(nvml, handle, by_bus):
            if peer is None:
                switch_links[index] = switch_links.get(index, 0) + 1
            elif peer != index:
                key = (min(index, peer), max(index, peer))
                direct[key] = direct.get(key, 0) + 1
    links: list[GpuLink] = []
    for a, b in combinations(sorted(handles), 2):
        try:
            level = int(nvml.nvmlDeviceGetTopologyCommonAncestor(handles[a], handles[b]))
            topology = Topology(level)
        except (nvml.NVMLError, ValueError) as exc:
            log.warning("GPUs %d and %d: PCIe topology unknown (%s)", a, b, exc)
            topology = Topology.SYSTEM
        # Each direct link is seen from both ends; behind NVSwitches every GPU reaches every
        # other one over all its switch links, so the pair gets the smaller of the two counts.
        nvlinks = (direct.get((a, b), 0) + 1) // 2 if (a, b) in direct else 0
        if a in switch_links and b in switch_links:
            nvlinks = max(nvlinks, min(switch_links[a], switch_links[b]))
        links.append(GpuLink(a=a, b=b, nvlinks=nvlinks, topology=topology))
    return tuple(links)


def _nvlink_peers(nvml: NvmlApi, handle: DeviceHandle, by_bus: dict[str, int]) -> list[int | None]:
    """Per active NVLink: the peer GPU index, or None for a link into an NVSwitch."""
    peers: list[int | None] = []
    for link in range(int(nvml.NVML_NVLINK_MAX_LINKS)):
        try:
            if not int(nvml.nvmlDeviceGetNvLinkState(handle, link)):
                continue
            remote = _bus_key(text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId))
        except nvml.NVMLError as exc:
            # NOT_SUPPORTED: no NVLink at all; INVALID_ARGUMENT: past the GPU's last link.
            if is_code(exc, nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_INVALID_ARGUMENT):
                break
            continue
        if remote in by_bus:
            peers.append(by_bus[remote])
        elif _remote_is_switch(nvml, handle, link):
            peers.append(None)
    return peers


def _remote_is_switch(nvml: NvmlApi, handle: DeviceHandle, link: int) -> bool:
    try:
        kind = int(nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link))
    except nvml.NVMLError:
        return False
    return kind == _NVLINK_DEVICE_TYPE_SWITCH


def _bus_key(bus_id: str) -> str:
    """NVML writes bus ids with an 8- or 4-digit domain and either case; compare them equal."""
    domain, _, rest = bus_id.strip().lower().partition(":")
    return f"{int(domain, 16):08x}:{rest}" if rest else bus_id.lower()
