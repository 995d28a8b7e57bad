"""What the daemon is doing right now, as the `/status` JSON and the `/readyz` answer.

The daemon writes into a `StatusBoard` as things happen (config applied, reload rejected, resource
registered, devices pushed, MIG layout pending); the HTTP endpoints only read it. Keeping it a plain
value holder, with no I/O and no reference to the daemon, lets the endpoints answer while a reload
is in progress and lets tests drive every state directly.

Readiness means "kubelet knows everything this config advertises": a config has been loaded and
every resource of it is registered. Until then the DaemonSet's readiness probe keeps a rolling
update from moving on to the next node, which is what an admin rolling out a new plugin version
wants.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sharing_plugin.mig.state import GpuMigState, MigState


@dataclass(slots=True)
class ResourceStatus:
    devices: int = 0
    healthy: int = 0
    draining: list[str] = field(default_factory=list)
    registered: bool = False


@dataclass(frozen=True, slots=True)
class ConfigStatus:
    name: str | None
    hash: str
    generation: int
    loaded_at: dt.datetime


def rfc3339(moment: dt.datetime) -> str:
    """UTC, millisecond precision, `Z` suffix: `2024-05-01T12:00:00.123Z`."""
    utc = moment.astimezone(dt.UTC)
    return utc.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class StatusBoard:
    """Mutable snapshot of the daemon's state; only the event loop's thread writes to it."""

    def __init__(self) -> None:
        self._config: ConfigStatus | None = None
        self._last_error: str | None = None
        self._resources: dict[str, ResourceStatus] = {}
        self._mig: dict[str, tuple[MigState, str | None]] = {}
        self._mps: dict[str, dict[str, Any]] = {}
        self._dra: dict[str, Any] | None = None
        self._memory_limits: Mapping[str, Any] | None = None
        self._usage: Callable[[], Mapping[str, Any] | None] | None = None

    # --- config ------------------------------------------------------------------------------

    def set_config(
        self,
        *,
        name: str | None,
        hash: str,
        generation: int | None = None,
        loaded_at: dt.datetime | None = None,
    ) -> int:
        """Record a config that was applied; clears `lastError`. Returns its generation.

        Without `generation`, the board counts applied configs itself (1, 2, ...).
        """
        if generation is None:
            generation = (self._config.generation if self._config else 0) + 1
        self._config = ConfigStatus(
            name=name,
            hash=hash,
            generation=generation,
            loaded_at=loaded_at or dt.datetime.now(dt.UTC),
        )
        self._last_error = None
        return generation

    def set_error(self, message: str | None) -> None:
        """Show a rejected reload (`file:line:col: path: message`); None clears it."""
        self._last_error = message

    @property
    def config(self) -> ConfigStatus | None:
        return self._config

    @property
    def last_error(self) -> str | None:
        return self._last_error

    # --- resources ---------------------------------------------------------------------------

    def set_resource(
        self,
        name: str,
        *,
        devices: int,
        healthy: int,
        draining: Iterable[str] = (),
        registered: bool | None = None,
    ) -> None:
        """Record what a resource advertises; `registered=None` keeps the previous value."""
        current = self._resources.get(name) or ResourceStatus()
        self._resources[name] = ResourceStatus(
            devices=devices,
            healthy=healthy,
            draining=sorted(draining),
            registered=current.registered if registered is None else registered,
        )

    def set_registered(self, name: str, registered: bool) -> None:
        """Mark a resource (un)registered; kubelet restarts flip this back to False."""
        current = self._resources.setdefault(name, ResourceStatus())
        current.registered = registered

    def remove_resource(self, name: str) -> None:
        self._resources.pop(name, None)

    @property
    def resources(self) -> dict[str, ResourceStatus]:
        """A copy: callers cannot change the board behind its back."""
        return {
            name: ResourceStatus(r.devices, r.healthy, list(r.draining), r.registered)
            for name, r in self._resources.items()
        }

    # --- MIG ---------------------------------------------------------------------------------

    def set_mig_states(self, states: Mapping[str, GpuMigState]) -> None:
        """Every GPU's layout state at once; GPUs left out have no declared layout any more."""
        self._mig = {gpu: (s.state, s.reason) for gpu, s in states.items()}

    # --- MPS ---------------------------------------------------------------------------------

    def set_mps(self, resource: str, daemon: Mapping[str, Any] | None) -> None:
        """An MPS resource's control daemon (state, pid, limits, restarts, reason); None: gone."""
        if daemon is None:
            self._mps.pop(resource, None)
        else:
            self._mps[resource] = dict(daemon)

    # --- DRA ---------------------------------------------------------------------------------

    def set_dra(self, *, shared_devices: str, reason: str | None = None) -> None:
        """How `run-dra` publishes shared GPUs (`capacity` or `replicas`), and why not as the
        config asks when it cannot."""
        old = self._dra.get("oldShares", []) if self._dra is not None else []
        self._dra = {"sharedDevices": shared_devices, "reason": reason, "oldShares": old}

    def set_dra_old_shares(self, devices: Sequence[Mapping[str, Any]]) -> None:
        """The shared devices claims hold at another share than the config's now: a replicas
        edit takes full effect on them as those claims are released."""
        if self._dra is not None:
            self._dra["oldShares"] = [dict(d) for d in devices]

    # --- memory caps -------------------------------------------------------------------------

    def set_memory_limits(self, document: Mapping[str, Any]) -> None:
        """`memoryLimits`: the mode and, per GPU, whether its shares' caps are enforced."""
        self._memory_limits = document

    # --- GPU usage ---------------------------------------------------------------------------

    def set_usage(self, document: Callable[[], Mapping[str, Any] | None] | None) -> None:
        """Where the `usage` key (who holds and uses each GPU) comes from: a function of the
        latest reading, built only when `/status` is asked for (None from it: not read yet)."""
        self._usage = document

    # --- readiness and JSON ------------------------------------------------------------------

    def readiness(self) -> tuple[bool, str]:
        """(ready, a one-line reason for `/readyz`)."""
        if self._config is None:
            return False, "no config loaded yet"
        waiting = sorted(n for n, r in self._resources.items() if not r.registered)
        if waiting:
            return False, "not registered with kubelet: " + ", ".join(waiting)
        return True, f"ready: {len(self._resources)} resource(s) registered"

    @property
    def ready(self) -> bool:
        return self.readiness()[0]

    def to_json(self) -> dict[str, Any]:
        """The `/status` document (docs/contract.md; `ready` and `registered` are extra keys)."""
        config = self._config
        return {
            "ready": self.ready,
            "config": {
                "name": config.name if config else None,
                "hash": config.hash if config else None,
                "generation": config.generation if config else 0,
                "loadedAt": rfc3339(config.loaded_at) if config else None,
            },
            "lastError": self._last_error,
            "resources": {
                name: {
                    "devices": r.devices,
                    "healthy": r.healthy,
                    "draining": list(r.draining),
                    "registered": r.registered,
                }
                for name, r in sorted(self._resources.items())
            },
            "mig": {
                gpu: {"state": state.value, "reason": reason}
                for gpu, (state, reason) in sorted(self._mig.items())
            },
            "mps": {name: dict(daemon) for name, daemon in sorted(self._mps.items())},
            **({"dra": dict(self._dra)} if self._dra is not None else {}),
            **(
                {"memoryLimits": dict(self._memory_limits)}
                if self._memory_limits is not None
                else {}
            ),
            **({"usage": dict(usage)} if (usage := self._usage_document()) is not None else {}),
        }

    def _usage_document(self) -> Mapping[str, Any] | None:
        return self._usage() if self._usage is not None else None
