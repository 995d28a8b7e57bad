"""Rules that span several fields, and the warnings and notes a valid config still deserves.

Pydantic checks one field at a time; these rules compare entries with each other (overlapping
device selections, rename collisions) or sections with each other (MPS with mixed MIG). Each rule
yields an `Issue` with the path it is about, relative to the section that checks it, so that the
loader can point at the exact line. All issues of a section are raised together.

Warnings say a valid config is probably not what the admin meant; notes say where it means more
here than in the reference plugin, whose binary ignores explicit renames, device selections and
the `resources` section. Both are `path: message` lines, so that they can be located like errors.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic_core import PydanticCustomError

from sharing_plugin.config.base import DeviceListStrategy
from sharing_plugin.config.devices import overlap

if TYPE_CHECKING:
    from sharing_plugin.config.model import (
        Config,
        Health,
        Partitioning,
        PluginFlags,
        ReplicatedResource,
        Sharing,
    )

Loc = tuple[str | int, ...]
RULE_ERROR = "config_rule"
COMPAT = "accepted for compatibility; has no effect here"
XID_EVENTS = "EventTypeXidCriticalError"
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


@dataclass(frozen=True, slots=True)
class Issue:
    """A broken cross-field rule: where (relative to the checking section) and what to do."""

    loc: Loc
    message: str


def format_loc(loc: Loc) -> str:
    """`("sharing", "mps", "resources", 0)` -> `sharing.mps.resources[0]`."""
    out = ""
    for part in loc:
        if isinstance(part, str) and not part.isprintable():
            # A quoted key with a newline or control character: keep the message one line.
            out += f"[{part!r}]"
            continue
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def raise_issues(issues: Iterable[Issue]) -> None:
    """Raise every issue at once as one pydantic error; the loader splits them again."""
    found = tuple(issues)
    if found:
        summary = "; ".join(f"{format_loc(i.loc)}: {i.message}" for i in found)
        raise PydanticCustomError(RULE_ERROR, "{summary}", {"summary": summary, "issues": found})


def advertised_name(
    entry: ReplicatedResource, sharing: Sharing, *, honour_rename: bool = True
) -> str:
    """The name an entry's replicas are advertised under: its `rename`, else `<name>.shared`
    when its section sets renameByDefault, else its name. The one place this is decided: the
    plan, the rules and the notes must agree on it.

    `honour_rename=False` leaves the entry's own rename out: the name NVIDIA's device plugin
    binary advertises, since it resets explicit renames at start.
    """
    if honour_rename and entry.rename is not None:
        return entry.rename
    return f"{entry.name}.shared" if sharing.rename_by_default else entry.name


def sharing_issues(sharing: Sharing) -> Iterator[Issue]:
    entries = sharing.resources
    for j, later in enumerate(entries):
        for i, earlier in enumerate(entries[:j]):
            if earlier.name != later.name:
                continue
            common = overlap(earlier.devices, later.devices)
            if common is not None:
                yield Issue(
                    ("resources", j, "devices"),
                    f"overlaps resources[{i}] for {later.name} (both select {common}); "
                    "entries for the same resource must select disjoint devices",
                )
    owners: dict[str, tuple[int, str]] = {}
    for j, entry in enumerate(entries):
        name = advertised_name(entry, sharing)
        first = owners.setdefault(name, (j, entry.name))
        if first[1] != entry.name:
            yield Issue(
                ("resources", j, "rename" if entry.rename else "name"),
                f"{name!r} is also advertised for {first[1]} (resources[{first[0]}]); "
                "two resources cannot share one name: pick another rename",
            )


def partitioning_issues(partitioning: Partitioning) -> Iterator[Issue]:
    layouts = partitioning.mig
    for j, later in enumerate(layouts):
        for i, earlier in enumerate(layouts[:j]):
            common = overlap(earlier.devices, later.devices)
            if common is not None:
                yield Issue(
                    ("mig", j, "devices"),
                    f"overlaps mig[{i}] (both select {common}); each GPU gets one layout",
                )


@dataclass(frozen=True, slots=True)
class HealthResolution:
    """The health section in our terms (fields to set) and what contradicts itself."""

    update: dict[str, Any]
    issues: tuple[Issue, ...]


def _yaml_bool(value: bool) -> str:
    return "true" if value else "false"


def resolve_health(health: Health) -> HealthResolution:
    """Fold the reference's health keys into ours, with the reference's meaning.

    `disabled` is `not enabled`; `ignoredXIDs` is `ignoredXids`; an Xid in both an ignored list
    that was written and `criticalXIDs` is an error, as in the reference; `eventTypes` without
    Xid critical errors means no Xid is watched, so none is critical.
    """
    given = health.model_fields_set
    issues: list[Issue] = []
    enabled = health.enabled
    if health.disabled is not None:
        if "enabled" in given and health.enabled == health.disabled:
            said = (
                f"enabled: {_yaml_bool(health.enabled)} and disabled: "
                f"{_yaml_bool(health.disabled)} contradict each other; keep one of the two"
            )
            issues += [Issue(("enabled",), said), Issue(("disabled",), said)]
        enabled = not health.disabled
    ignored = health.ignored_xids
    ignored_written = "ignored_xids" in given
    if health.ignored_xids_reference is not None:
        if ignored_written:
            issues.append(
                Issue(
                    ("ignoredXIDs",),
                    "give one of ignoredXids or ignoredXIDs: they are two spellings of the "
                    "same list",
                )
            )
        ignored, ignored_written = health.ignored_xids_reference, True
    critical = health.critical_xids
    if critical is not None and ignored_written:
        for i, xid in enumerate(critical):
            if xid in ignored:
                issues.append(
                    Issue(
                        ("criticalXIDs", i),
                        f"XID {xid} is in both ignored and critical lists; remove it from one",
                    )
                )
    if health.event_types and XID_EVENTS not in health.event_types:
        critical = ()
    update = {
        "enabled": enabled,
        "ignored_xids": ignored,
        "critical_xids": critical,
        "disabled": None,
        "ignored_xids_reference": None,
    }
    return HealthResolution(update, tuple(issues))


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


def config_issues(config: Config) -> Iterator[Issue]:
    sharing = config.sharing
    if sharing.mps is not None and config.flags.mig_strategy == "mixed":
        yield Issue(
            ("sharing", "mps"),
            "MPS cannot share MIG devices, and migStrategy: mixed advertises them; "
            "use time-slicing, or migStrategy: none or single",
        )
    active = sharing.active
    if active is None:
        return
    section = "mps" if sharing.mps is not None else "timeSlicing"
    shared = {entry.name for entry in active.resources}
    declared = [
        (kind, k, pattern.name)
        for kind in ("gpus", "mig")
        for k, pattern in enumerate(getattr(config.resources, kind))
        if pattern.name not in shared
    ]
    for j, entry in enumerate(active.resources):
        name = advertised_name(entry, active)
        for kind, k, other in declared:
            if other == name and other != entry.name:
                yield Issue(
                    ("sharing", section, "resources", j, "rename" if entry.rename else "name"),
                    f"{name!r} is already advertised for resources.{kind}[{k}]; "
                    "pick another rename",
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


def config_warnings(config: Config) -> list[str]:
    """Things that are valid but probably not what the admin meant, or have no effect here."""
    warnings: list[str] = []
    flags = config.flags
    for key, value in (
        ("restartOnDeviceUnhealthy", flags.restart_on_device_unhealthy),
        ("gdrcopyEnabled", flags.gdrcopy_enabled),
        ("gdsEnabled", flags.gds_enabled),
        ("mofedEnabled", flags.mofed_enabled),
        ("useNodeFeatureAPI", flags.use_node_feature_api),
        ("deviceDiscoveryStrategy", flags.device_discovery_strategy),
        ("gfd", flags.gfd),
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
    if config.partitioning is not None and config.partitioning.mig and flags.mig_strategy == "none":
        warnings.append(
            "partitioning.mig: MIG layouts are declared but flags.migStrategy is none, "
            "so the MIG devices will not be advertised; set migStrategy: single or mixed"
        )
    trap = envvar_trap(flags.plugin, declared_resources(config))
    if trap is not None:
        warnings.append(trap)
    return warnings
