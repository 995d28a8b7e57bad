"""The sections that say how the plugin runs, not what it advertises: flags, health, imex.

Most keys here come from the reference plugin's command line and are kept so that its configs
load unchanged; those we cannot honour are accepted and reported as having no effect rather than
refused. Health accepts both our spellings and the reference's newer ones and folds them into
ours once, during validation, so later code reads one meaning. Spellings that contradict each
other cannot be folded: such a section is left as written, and the contradictions are reported
as issues by the rules checked on the built config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field, StrictBool, StrictInt, StrictStr, model_validator

from sharing_plugin.config.base import (
    DEFAULT_IGNORED_XIDS,
    AllocationPolicy,
    DeviceIdStrategy,
    DeviceListStrategy,
    EventType,
    Issue,
    MigStrategy,
    Strict,
    Xid,
)
from sharing_plugin.config.compat import (
    CriticalXids,
    DeviceListStrategies,
    DiscoveryStrategy,
    GoDuration,
    ImexChannelIds,
)

__all__ = [
    "Flags",
    "GfdFlags",
    "Health",
    "HealthResolution",
    "Imex",
    "PluginFlags",
    "resolve_health",
]


class PluginFlags(Strict):
    """Options of the device plugin itself (`flags.plugin`)."""

    pass_device_specs: StrictBool = False
    """Also answer Allocate with device nodes (needed with the CPU manager)."""
    device_list_strategy: DeviceListStrategies = (DeviceListStrategy.ENVVAR,)
    """How containers are told their devices: one strategy or a list of them."""
    device_id_strategy: DeviceIdStrategy = Field(DeviceIdStrategy.UUID, alias="deviceIDStrategy")
    """Tell containers GPU UUIDs or indices (advertised IDs are always UUID based)."""
    cdi_annotation_prefix: StrictStr = "cdi.k8s.io/"
    """Prefix of the CDI annotations (cdi-annotations strategy)."""
    nvidia_ctk_path: StrictStr | None = Field(None, alias="nvidiaCTKPath")
    """Accepted for compatibility; has no effect here."""
    container_driver_root: StrictStr = "/driver-root"
    """Where the driver root is mounted inside the plugin container."""
    shared_devices_allocation_policy: AllocationPolicy = AllocationPolicy.DISTRIBUTED
    """How replicas are picked: spread over GPUs (distributed) or fill one GPU first (packed)."""
    kubelet_socket: StrictStr | None = None
    """Accepted for compatibility; has no effect here (use --kubelet-dir)."""
    cdi_feature_flags: StrictStr | None = Field(None, alias="cdiFeatureFlags")
    """Accepted for compatibility; has no effect here."""


class GfdFlags(Strict):
    """Options of gpu-feature-discovery; accepted for compatibility, no effect here, except
    `useNodeFeatureAPI` (the same as flags.useNodeFeatureAPI)."""

    use_node_feature_api: StrictBool | None = Field(None, alias="useNodeFeatureAPI")
    """The same as flags.useNodeFeatureAPI (true: labels go to an NFD NodeFeature object)."""
    oneshot: StrictBool | None = None
    no_timestamp: StrictBool | None = None
    sleep_interval: GoDuration = None
    output_file: StrictStr | None = None
    machine_type_file: StrictStr | None = None


class Flags(Strict):
    """Options shared with the reference plugin's command line."""

    mig_strategy: MigStrategy = MigStrategy.NONE
    """How MIG devices are advertised: none, single (as nvidia.com/gpu) or mixed (per profile)."""
    fail_on_init_error: StrictBool = True
    """Exit at start when NVML cannot read the GPUs (false: start with those that answer)."""
    nvidia_driver_root: StrictStr = "/"
    """Root of the NVIDIA driver installation on the host."""
    nvidia_dev_root: StrictStr = "/"
    """Root under which the NVIDIA device nodes live on the host (default: nvidiaDriverRoot)."""
    mps_root: StrictStr = "/run/nvidia/mps"
    """Host directory for the MPS control daemon's pipes and logs."""
    restart_on_device_unhealthy: StrictBool | None = None
    """Accepted for compatibility; has no effect here (unhealthy devices are reported)."""
    gdrcopy_enabled: StrictBool | None = None
    """Accepted for compatibility; has no effect here."""
    gds_enabled: StrictBool | None = None
    """Accepted for compatibility; has no effect here."""
    mofed_enabled: StrictBool | None = None
    """Accepted for compatibility; has no effect here."""
    use_node_feature_api: StrictBool | None = Field(None, alias="useNodeFeatureAPI")
    """true: `run` also publishes the node's labels as an NFD NodeFeature object (needs
    --node-name, credentials and POD_NAMESPACE); flags.gfd.useNodeFeatureAPI says the same."""
    device_discovery_strategy: DiscoveryStrategy = None
    """Accepted for compatibility; has no effect here (devices are found through NVML)."""
    plugin: PluginFlags = PluginFlags()
    gfd: GfdFlags | None = None
    """gpu-feature-discovery options: accepted for compatibility; no effect here but
    useNodeFeatureAPI."""

    @model_validator(mode="after")
    def _node_feature_api_once(self) -> Flags:
        # GFD's spelling under `gfd` and the reference's under `flags` mean the same: fold the
        # first into the second, once, so that later code reads one field. Two that differ are
        # left as written, for the rules to report.
        below = self.gfd.use_node_feature_api if self.gfd is not None else None
        if below is not None and self.use_node_feature_api is None:
            # Still inside validation, before anyone holds the instance (as in Health).
            self.__dict__["use_node_feature_api"] = below
        return self

    @model_validator(mode="before")
    @classmethod
    def _dev_root_follows_driver_root(cls, data: Any) -> Any:
        # As in the reference: device nodes live under the driver root unless told otherwise.
        if isinstance(data, dict) and not {"nvidiaDevRoot", "nvidia_dev_root"} & data.keys():
            root = data.get("nvidiaDriverRoot", data.get("nvidia_driver_root"))
            if isinstance(root, str):
                return {**data, "nvidiaDevRoot": root}
        return data


DRIVER_ROOT_ENV = "NVIDIA_DRIVER_ROOT"


def with_driver_root(flags: Flags, root: str | None) -> Flags:
    """`flags` with the node's driver root (`NVIDIA_DRIVER_ROOT`, as the reference reads it)
    where the config names none; device nodes follow it unless the config names theirs."""
    if not root or "nvidia_driver_root" in flags.model_fields_set:
        return flags
    update = {"nvidia_driver_root": root}
    if "nvidia_dev_root" not in flags.model_fields_set:
        update["nvidia_dev_root"] = root
    return flags.model_copy(update=update)


class Health(Strict):
    """GPU health checking through NVML Xid events.

    Our keys (`enabled`, `ignoredXids`) and the reference's newer ones (`disabled`,
    `ignoredXIDs`, `criticalXIDs`, `eventTypes`) are both accepted and resolved here, once:
    afterwards `enabled`, `ignored_xids` and `critical_xids` say everything, and `disabled`
    and `ignored_xids_reference` are always None.
    """

    enabled: StrictBool = True
    """Watch Xid events and mark affected devices Unhealthy."""
    ignored_xids: tuple[Xid, ...] = DEFAULT_IGNORED_XIDS
    """Xids that are application errors, not GPU faults."""
    critical_xids: CriticalXids = Field(None, alias="criticalXIDs")
    """Which Xids mark a GPU Unhealthy: all (absent) or only the listed ones."""
    event_types: tuple[EventType, ...] | None = None
    """NVML event types to watch (reference plugin); absent or empty: Xid critical errors,
    double-bit and single-bit ECC errors. A double-bit ECC error marks its GPU Unhealthy."""
    disabled: StrictBool | None = None
    """The reference's spelling of enabled: false."""
    ignored_xids_reference: tuple[Xid, ...] | None = Field(None, alias="ignoredXIDs")
    """The reference's spelling of ignoredXids."""
    recovery_quiet_period_seconds: Annotated[StrictInt, Field(ge=0)] = 60
    """An Unhealthy device is Healthy again once NVML answers and no fault came for this long."""
    recovery_check_seconds: Annotated[StrictInt, Field(ge=1)] = 30
    """First recheck of an Unhealthy device; the delay doubles while NVML does not answer."""
    recovery_check_max_seconds: Annotated[StrictInt, Field(ge=1)] = 300
    """Longest delay between two rechecks of an Unhealthy device."""

    @model_validator(mode="after")
    def _resolve(self) -> Health:
        resolved = resolve_health(self)
        # Spellings that contradict each other are left as written, for the rules to report;
        # the loader never hands out such a section.
        if not resolved.contradictions:
            # Still inside validation, before anyone holds the instance: the one place the
            # frozen model is written, so that no later code sees the reference's spellings.
            self.__dict__.update(resolved.update)
        return self


@dataclass(frozen=True, slots=True)
class HealthResolution:
    """The health section in our terms (fields to set) and what contradicts itself in it."""

    update: dict[str, Any]
    contradictions: tuple[Issue, ...]  # paths inside the section


def _yaml_bool(value: bool) -> str:
    return "true" if value else "false"


def resolve_health(health: Health) -> HealthResolution:
    """Fold the reference's health keys into ours, with the reference's meaning.

    `disabled` is `not enabled`; `ignoredXIDs` is `ignoredXids`; an Xid in both an ignored list
    that was written and `criticalXIDs` is an error, as in the reference; `eventTypes` without
    Xid critical errors means no Xid is watched, so none is critical. A resolved section has
    nothing left to contradict.
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
    if health.event_types and EventType.XID_CRITICAL_ERROR not in health.event_types:
        critical = ()
    update = {
        "enabled": enabled,
        "ignored_xids": ignored,
        "critical_xids": critical,
        "disabled": None,
        "ignored_xids_reference": None,
    }
    return HealthResolution(update, tuple(issues))


class Imex(Strict):
    """IMEX channels (reference plugin); accepted for compatibility, no effect here."""

    channel_ids: ImexChannelIds = Field((), alias="channelIDs")
    required: StrictBool = False
