"""What `sharing-plugin run` was asked to do, resolved once from flags and env vars."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sharing_plugin.daemon.node.health_monitor import HealthEnv
from sharing_plugin.daemon.node.options import NodeReportOptions, SourceOptions
from sharing_plugin.daemon.node.recheck import HELD_RECHECK_S
from sharing_plugin.kubelet.grants import RECORD_WINDOW_S


@dataclass(frozen=True, slots=True)
class RunOptions:
    """Everything `sharing-plugin run` takes, resolved from flags and env vars."""

    source: SourceOptions = field(default_factory=SourceOptions)
    report: NodeReportOptions = field(default_factory=NodeReportOptions)
    metrics_address: tuple[str, int] | None = None
    drain_recheck_s: float = HELD_RECHECK_S  # how often pods are asked about while devices drain
    # How long an Allocate grant counts as held when PodResources does not list it (see
    # kubelet/grants.py).
    grant_window_s: float = RECORD_WINDOW_S
    proc_root: Path = Path("/proc")  # the host's processes, for per-pod GPU usage
    cdi_dir: Path = Path("/var/run/cdi")  # where the memory-limit CDI spec is written
    # The reference's DP_*_HEALTHCHECKS variables, parsed once by the entry point.
    health_env: HealthEnv = field(default_factory=HealthEnv)
