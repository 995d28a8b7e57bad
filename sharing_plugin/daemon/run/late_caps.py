"""The late mend of memory caps: a capped container whose cgroup has no limit gets it from us.

Each usage reading names the cgroups capped containers' processes run in and the cap the hook
would have set (`usage.caps`). A cgroup not seen capped yet is asked through NVML; where it
has no limit (the runtime ran no CDI hook: no CDI, an older toolkit) the plugin sets it and
counts it, so a cap is in force within one usage period whatever the runtime did. A cgroup
with a limit keeps it: the hook set it, or an earlier config did (running pods keep theirs).
NVML's answer for a cgroup is remembered while its container runs, so a steady node asks
nothing. Where this cannot work (bindings without the calls, an NVML error) it is said once.
Needs the host's processes (`deploy/components/usage`) and NVML's permission to set limits.
"""

from __future__ import annotations

import logging
import threading

from sharing_plugin.errors import NvmlError
from sharing_plugin.nvml.api import NvmlApi
from sharing_plugin.nvml.calls import nvml_errors, nvml_session
from sharing_plugin.nvml.memory_limits import bindings_problem, read_limit, set_limit
from sharing_plugin.observability.metrics import Metrics
from sharing_plugin.usage.caps import CgroupCap

log = logging.getLogger(__name__)


class LateCaps:
    """Checks and mends the caps of one reading at a time (blocking: from a worker thread)."""

    def __init__(self, nvml: NvmlApi, metrics: Metrics) -> None:
        self._nvml = nvml
        self._metrics = metrics
        self._lock = threading.Lock()
        self._checked: set[tuple[str, str, int]] = set()  # (GPU, cgroup, MiB) found or set
        self._told: set[str] = set()  # problems already logged

    def mend(self, caps: list[CgroupCap]) -> int:
        """Check each of `caps` not seen yet; set the missing ones. How many were set."""
        with self._lock:
            todo = [c for c in caps if (c.gpu, c.cgroup, c.mib) not in self._checked]
            self._checked &= {(c.gpu, c.cgroup, c.mib) for c in caps}  # containers that left
            if not todo:
                return 0
            problem = bindings_problem(self._nvml)
            if problem is not None:
                self._say(f"memoryLimits: caps the hook did not set cannot be set here: {problem}")
                return 0
            with nvml_session(self._nvml):
                return sum(self._one(cap) for cap in todo)

    def _one(self, cap: CgroupCap) -> bool:
        try:
            with nvml_errors(self._nvml, f"finding GPU {cap.gpu}"):
                handle = self._nvml.nvmlDeviceGetHandleByUUID(cap.gpu)
            found = read_limit(self._nvml, handle, cap.cgroup)
            self._checked.add((cap.gpu, cap.cgroup, cap.mib))
            if found.hard_mib is not None:
                return False
            set_limit(self._nvml, handle, cap.cgroup, cap.mib)
        except NvmlError as exc:
            self._say(f"memoryLimits: checking the cap of {cap.holder.pod or cap.cgroup}: {exc}")
            return False
        holder = cap.holder
        log.warning(
            "memoryLimits: %s/%s container %s on GPU %s had no GPU memory cap (was the CDI hook "
            "run?): capped at %d MiB now",
            holder.namespace,
            holder.pod,
            holder.container,
            cap.gpu,
            cap.mib,
        )
        self._metrics.count_cap_applied_late(cap.gpu)
        return True

    def _say(self, text: str) -> None:
        if text not in self._told:
            self._told.add(text)
            log.warning("%s", text)
