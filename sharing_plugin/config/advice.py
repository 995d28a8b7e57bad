"""What a valid config still deserves: warnings and notes.

Warnings say a valid config is probably not what the admin meant (or holds keys accepted for
compatibility that do nothing here); notes say where it means more here than in the reference
plugin, whose binary ignores explicit renames, device selections and the `resources` section.
Both are `path: message` lines, so that they can be located like errors.
"""

from __future__ import annotations

from collections.abc import Iterator

from sharing_plugin.config.base import DeviceListStrategy, EventType
from sharing_plugin.config.model import Config, Flags, Health, PluginFlags
from sharing_plugin.config.rules import advertised_name

COMPAT = "accepted for compatibility; has no effect here"
XID_EVENTS = EventType.XID_CRITICAL_ERROR.value
REFERENCE_IGNORES = "honoured here; NVIDIA's device plugin ignores it"
# Each of these carries the whole device list by itself: with volume-mounts every Allocate answer
# sets NVIDIA_VISIBLE_DEVICES to the same mount directory and kubelet keeps every mount; with CDI
# kubelet keeps every device name and annotation.
_MERGEABLE_LISTS = frozenset(
    {
        DeviceListStrategy.VOLUME_MOUNTS,
        DeviceListStrategy.CDI_ANNOTATIONS,
        DeviceListStrategy.CDI_CRI,
    }
)


def health_warnings(health: Health) -> Iterator[str]:
    events = health.event_types or ()
    if events and XID_EVENTS not in events:
        yield (
            f"health.eventTypes: {XID_EVENTS} is not listed, so no Xid marks a GPU Unhealthy "
            "(double-bit ECC errors, when listed, and GPUs that stop answering NVML still do); "
            "add it to watch Xids"
        )
    elif health.critical_xids == ():
        yield (
            "health.criticalXIDs: the list is empty, so no Xid marks a GPU Unhealthy (GPUs "
            "that stop answering NVML still do); list Xids, or write all"
        )
    never = sorted(set(health.critical_xids or ()) & set(health.ignored_xids))
    if never and health.enabled:
        yield (
            f"health.criticalXIDs: {', '.join(map(str, never))} also in the default ignored "
            f"Xids ({', '.join(map(str, health.ignored_xids))}), and ignored Xids never count, "
            "as in the reference plugin; give ignoredXids without them to make them count"
        )


def declared_resources(config: Config) -> list[str]:
    """The resource names the config itself advertises, whatever the node (in first-seen order).

    Sharing entries advertise their name (or rename); `resources` patterns advertise theirs
    unless a sharing entry takes the name over. Names that depend on the node are not here: GPUs
    no pattern matches (nvidia.com/gpu), MIG profiles under migStrategy mixed, the devices a
    selection leaves unshared.
    """
    names: dict[str, None] = {}
    active = config.sharing.active
    shared: set[str] = set()
    if active is not None:
        for entry in active.resources:
            names[advertised_name(entry, active)] = None
            shared.add(entry.name)
    for pattern in (*config.resources.gpus, *config.resources.mig):
        if pattern.name not in shared:
            names[pattern.name] = None
    return list(names)


def _envvar_carries_the_list(plugin: PluginFlags) -> bool:
    strategies = set(plugin.device_list_strategy)
    return DeviceListStrategy.ENVVAR in strategies and not strategies & _MERGEABLE_LISTS


def envvar_trap(plugin: PluginFlags, resources: list[str]) -> str | None:
    """The warning for two or more resources whose device lists travel only in one env var.

    kubelet merges the Allocate answers of a container's resources by env var name, so a
    container that requests two of them keeps one NVIDIA_VISIBLE_DEVICES: the GPUs of only one.
    """
    if len(resources) < 2 or not _envvar_carries_the_list(plugin):
        return None
    return (
        f"flags.plugin.deviceListStrategy: envvar with {len(resources)} resources "
        f"({', '.join(resources)}): a container that requests two of them sees the GPUs of only "
        "one, because kubelet keeps one NVIDIA_VISIBLE_DEVICES per container; use "
        "deviceListStrategy volume-mounts, cdi-annotations or cdi-cri, or request one of these "
        "resources per container"
    )


def plan_envvar_trap(config: Config, advertised: list[str]) -> str | None:
    """The envvar warning for what a node advertises, unless the config's own warning said it."""
    if envvar_trap(config.flags.plugin, declared_resources(config)) is not None:
        return None
    return envvar_trap(config.flags.plugin, advertised)


def config_notes(config: Config) -> list[str]:
    """What this config does here that NVIDIA's device plugin binary would not do.

    The reference reads these keys but its binary resets them at start with a warning
    (`DisableResourceNamingInConfig`): an explicit rename (one other than `<name>.shared` under
    renameByDefault), a device selection other than all, and the whole `resources` section.
    """
    notes: list[str] = []
    for kind, theirs in (
        ("gpus", "every full GPU as nvidia.com/gpu"),
        (
            "mig",
            "MIG devices as migStrategy names them (nvidia.com/gpu or nvidia.com/mig-<profile>)",
        ),
    ):
        patterns = getattr(config.resources, kind)
        if patterns:
            names = ", ".join(dict.fromkeys(p.name for p in patterns))
            notes.append(
                f"resources.{kind}: {REFERENCE_IGNORES} and advertises {theirs}, not {names}"
            )
    sharing = config.sharing
    for section, block in (("timeSlicing", sharing.time_slicing), ("mps", sharing.mps)):
        if block is None:
            continue
        for j, entry in enumerate(block.resources):
            where = f"sharing.{section}.resources[{j}]"
            theirs = advertised_name(entry, block, honour_rename=False)
            if entry.rename is not None and entry.rename != theirs:
                notes.append(
                    f"{where}.rename: {REFERENCE_IGNORES} and advertises {theirs}, "
                    f"not {entry.rename}"
                )
            if entry.devices != "all":
                notes.append(
                    f"{where}.devices: {REFERENCE_IGNORES} and shares every {entry.name} "
                    "device, not only the selected ones"
                )
    return notes


MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
MIG_REPLICAS_UNCAPPED = (
    "{path}: memoryLimits cannot cap replicas of a MIG device (the driver caps memory on whole "
    "GPUs only): its replicas share the MIG device's memory uncapped"
)


def _gfd_without_node_feature_api(flags: Flags) -> object:
    """The gfd section when it sets anything but useNodeFeatureAPI, which has an effect."""
    gfd = flags.gfd
    if gfd is None or not gfd.model_fields_set - {"use_node_feature_api"}:
        return None
    return gfd


def config_warnings(config: Config) -> list[str]:
    """Things that are valid but probably not what the admin meant, or have no effect here."""
    warnings: list[str] = []
    flags = config.flags
    for key, value in (
        ("restartOnDeviceUnhealthy", flags.restart_on_device_unhealthy),
        ("gdrcopyEnabled", flags.gdrcopy_enabled),
        ("gdsEnabled", flags.gds_enabled),
        ("mofedEnabled", flags.mofed_enabled),
        ("deviceDiscoveryStrategy", flags.device_discovery_strategy),
        ("gfd", _gfd_without_node_feature_api(flags)),
        ("plugin.nvidiaCTKPath", flags.plugin.nvidia_ctk_path),
        ("plugin.kubeletSocket", flags.plugin.kubelet_socket),
        ("plugin.cdiFeatureFlags", flags.plugin.cdi_feature_flags),
    ):
        if value is not None:
            warnings.append(f"flags.{key}: {COMPAT}")
    if config.imex is not None:
        warnings.append(f"imex: {COMPAT}")
    warnings.extend(health_warnings(config.health))
    sharing = config.sharing
    for section, block in (("timeSlicing", sharing.time_slicing), ("mps", sharing.mps)):
        if block is None:
            continue
        if block.strategy is not None:
            warnings.append(
                f"sharing.{section}.strategy: {COMPAT} (replicas are placed by "
                "flags.plugin.sharedDevicesAllocationPolicy)"
            )
        for j, entry in enumerate(block.resources):
            if entry.replicas == 1:
                warnings.append(
                    f"sharing.{section}.resources[{j}].replicas: 1 means not shared "
                    "(each device is advertised once)"
                )
            if config.memory_limits.on and entry.name.startswith(MIG_RESOURCE_PREFIX):
                warnings.append(
                    MIG_REPLICAS_UNCAPPED.format(path=f"sharing.{section}.resources[{j}]")
                )
    # A dynamic entry's placements are published whatever the strategy (run-dra only).
    fixed = [m for m in config.partitioning.mig if not m.dynamic] if config.partitioning else []
    if fixed and flags.mig_strategy == "none":
        warnings.append(
            "partitioning.mig: MIG layouts are declared but flags.migStrategy is none, "
            "so the MIG devices will not be advertised; set migStrategy: single or mixed"
        )
    trap = envvar_trap(flags.plugin, declared_resources(config))
    if trap is not None:
        warnings.append(trap)
    return warnings
