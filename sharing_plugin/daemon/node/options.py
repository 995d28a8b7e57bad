"""What the serving commands were asked to do, resolved once from flags and env vars.

`SourceOptions` (where the config comes from, which GPUs, this node, the kubelet's directory) is
one value shared by `run`, `run-dra` and `mps-control`, which all feed the same node pipeline.
`NodeReportOptions` (what the pipeline tells the Node and NFD) is here too: the pipeline carries
it out for whichever command asks. Each command's own options hold these and only what that
command has, in that command's room.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sharing_plugin.config.names import DEFAULT_CONFIG_LABEL


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """Where the config comes from and which GPUs it is planned on."""

    config_path: Path | None = None
    config_name: str | None = None
    config_map: tuple[str, str] | None = None  # (namespace, name), read through the API
    config_label: str = DEFAULT_CONFIG_LABEL
    gpus: str = "nvml"
    kubelet_dir: Path = Path("/var/lib/kubelet")
    node_name: str | None = None
    # A config file that does not validate is reported once it has stayed so this long: an
    # editor may be half-way through saving it.
    config_error_settle_s: float = 0.1
    rediscover_s: float = 1.0  # first look again for GPUs when NVML found none (doubling)
    # What `memoryLimits` needs to know of the node: its cgroup hierarchy (found once at start:
    # the host's, or a simulated node's own) and $NVIDIA_CDI_HOOK_PATH, the hook's default path.
    cgroup_version: int | None = None
    hook_path_default: str | None = None
    # $NVIDIA_DRIVER_ROOT: the driver root of a config that names none (the GPU Operator's
    # /run/nvidia/driver), read once at start.
    driver_root_default: str | None = None

    @property
    def needs_api(self) -> bool:
        """The node label (`node_name`) and the ConfigMap (`config_map`) are read from the API."""
        return self.node_name is not None or self.config_map is not None


@dataclass(frozen=True, slots=True)
class NodeReportOptions:
    """What `run` tells the Node and NFD about itself (with `--node-name` and credentials)."""

    node_status: bool = True  # events, state label and annotation on the Node
    clear_labels_on_exit: bool = False
    labels_file: Path | None = None  # NFD local feature file for GFD-compatible labels
    node_labels: bool = False  # patch the same labels onto the Node
    # The plugin's pod (downward API: POD_NAMESPACE, POD_NAME, POD_UID): where NFD's
    # NodeFeature object is written (`flags.useNodeFeatureAPI`), and its owner.
    pod_namespace: str | None = None
    pod_name: str | None = None
    pod_uid: str | None = None
