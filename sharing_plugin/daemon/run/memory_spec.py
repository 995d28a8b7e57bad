"""The memory-limit CDI spec `run` keeps in `--cdi-dir` while `memoryLimits` is on.

Allocate answers a capped replica with the CDI device of its GPU; the runtime resolves it from
this spec when it creates the container, so the spec is written before a plan with caps is
served, rewritten (whole, atomically) when the GPUs or the hook change, and never removed: a
container created while the plugin restarts, or after an edit turned caps off, must still
resolve the device it was given.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sharing_plugin.config.memory import hook_path
from sharing_plugin.daemon.node.outcome import Applied
from sharing_plugin.errors import SharingPluginError
from sharing_plugin.kit.cdi import CdiSpecDir


class MemoryLimitSpec:
    """Writes the spec when what it says changes (see the module doc)."""

    def __init__(self, cdi_dir: Path, *, hook_path_default: str | None) -> None:
        self._dir = CdiSpecDir(cdi_dir)
        self._hook_default = hook_path_default
        self._written: dict[str, Any] | None = None

    def follow(self, applied: Applied) -> None:
        """Keep the spec for `applied`; raises SharingPluginError when it cannot be written (the
        caps could not be resolved, so the config is not served)."""
        limits = applied.config.memory_limits
        if not limits.on:
            return
        # Loaded with the first config that caps: a `run` without caps never needs it.
        from sharing_plugin.views.cdi_memory import memory_limit_spec, spec_file_name

        spec = memory_limit_spec(
            [gpu.uuid for gpu in applied.inventory.gpus],
            hook_path=hook_path(limits, self._hook_default),
            driver_root=applied.config.flags.nvidia_driver_root,
        )
        if spec == self._written:
            return
        try:
            self._dir.write(spec_file_name(), spec)
        except OSError as exc:
            raise SharingPluginError(
                f"memoryLimits: cannot write the memory-limit CDI spec in {self._dir.path}: "
                f"{exc.strerror or exc} (mount the runtime's CDI directory there, or set --cdi-dir)"
            ) from exc
        self._written = spec
