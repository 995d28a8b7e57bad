"""What `sharing-plugin run` was asked to do, resolved once from flags and env vars."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sharing_plugin.config.names import DEFAULT_CONFIG_LABEL
from sharing_plugin.daemon.health_monitor import HealthEnv
from sharing_plugin.kubelet.grants import RECORD_WINDOW_S


@dataclass(frozen=True, slots=True)
class RunOptions:
    """Everything `sharing-plugin run` takes, resolved from flags and env vars."""

    config_path: Path | None = None
    config_name: str | None = None
    config_map: tuple[str, str] | None = None  # (namespace, name), read through the API
    gpus: str = "nvml"
    kubelet_dir: Path = Path("/var/lib/kubelet")
    node_name: str | None = None
    node_status: bool = True  # events, state label and annotation on the Node (with node_name)
    clear_labels_on_exit: bool = False
    labels_file: Path | None = None  # NFD local feature file for GFD-compatible labels
    node_labels: bool = False  # patch the same labels onto the Node
    metrics_address: tuple[str, int] | None = None
    config_label: str = DEFAULT_CONFIG_LABEL
    drain_recheck_s: float = 2.0  # how often PodResources is asked while devices drain
    # How long an Allocate grant counts as held when PodResources does not list it (see
    # kubelet/grants.py).
    grant_window_s: float = RECORD_WINDOW_S
    # A config file that does not validate is reported once it has stayed so this long: an
    # editor may be half-way through saving it.
    config_error_settle_s: float = 0.1
    rediscover_s: float = 5.0  # first look again for GPUs when NVML did not start (doubling)
    proc_root: Path = Path("/proc")  # the host's processes, for per-pod GPU usage
    # The reference's DP_*_HEALTHCHECKS variables, parsed once by the entry point.
    health_env: HealthEnv = field(default_factory=HealthEnv)
