"""The plugin's own error tree.

    SharingPluginError
    ├── ConfigError          one or more problems in a config, each with file:line:col and a path
    ├── PlanError            a valid config that does not fit this node (carries ConfigProblems too)
    ├── MigError             a MIG layout that cannot be realised, or an NVML MIG call that failed
    ├── NvmlError            an NVML call failed (the NVML error name is in the message)
    │   └── GpuLostError     the GPU stopped answering (NVML_ERROR_GPU_IS_LOST)
    ├── AllocationError      a kubelet request the plan refuses (maps to INVALID_ARGUMENT)
    ├── KubeletError         registration or socket trouble with kubelet
    ├── KubeApiError         the Kubernetes API refused or failed a request (node label watch)
    ├── MetricsServerError   the metrics/health HTTP address cannot be listened on
    ├── MpsError             the MPS control binary failed, or its daemon does not answer
    └── StartupError         the daemon cannot start at all (GPUs unreadable with failOnInitError)

Library errors are translated at the adapter boundary (`raise ... from exc`); only the entry point
turns errors into exit codes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a config: where it is and what to do about it.

    `path` is the dotted path inside the config (``sharing.timeSlicing.resources[0].replicas``);
    `file`, `line` and `column` (1-based) point at the offending key or value when known.
    """

    path: str
    message: str
    file: str | None = None
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        where = ""
        if self.file is not None and self.line is not None:
            column = f"{self.column}:" if self.column is not None else ""
            where = f"{self.file}:{self.line}:{column} "
        elif self.file is not None:  # no position known: never a made-up 0:0
            where = f"{self.file}: "
        path = f"{self.path}: " if self.path else ""
        return f"{where}{path}{self.message}"


class SharingPluginError(Exception):
    """Base of every error the plugin raises on purpose."""


class ConfigError(SharingPluginError):
    """A config that does not validate; holds every problem found, in document order."""

    def __init__(self, problems: list[Problem] | tuple[Problem, ...]) -> None:
        self.problems: tuple[Problem, ...] = tuple(problems)
        super().__init__("\n".join(str(p) for p in self.problems) or "invalid config")


class PlanError(ConfigError):
    """A config that validates but cannot be applied to this node's GPUs."""


class MigError(SharingPluginError):
    """A MIG layout that cannot be realised on a GPU, or a MIG operation that failed."""


class NvmlError(SharingPluginError):
    """An NVML call failed; `code` is the NVML return code, `name` its NVML_ERROR_* name."""

    def __init__(self, message: str, *, code: int | None = None, name: str | None = None) -> None:
        self.code = code
        self.name = name
        super().__init__(message)


class GpuLostError(NvmlError):
    """The GPU no longer answers NVML (NVML_ERROR_GPU_IS_LOST)."""


class AllocationError(SharingPluginError):
    """A kubelet Allocate/GetPreferredAllocation request that the plan refuses."""


class KubeletError(SharingPluginError):
    """Registration with kubelet failed, or its sockets are not usable."""


class KubeApiError(SharingPluginError):
    """A Kubernetes API request failed; `code` is the HTTP status when one was received."""

    def __init__(self, message: str, *, code: int | None = None) -> None:
        self.code = code
        super().__init__(message)


class MetricsServerError(SharingPluginError):
    """The metrics/health HTTP server cannot listen on its address (in use, not local, ...)."""


class MpsError(SharingPluginError):
    """The MPS control binary failed or is missing, or its daemon does not answer."""


class StartupError(SharingPluginError):
    """The daemon cannot start at all (e.g. NVML does not answer and failOnInitError is set)."""
