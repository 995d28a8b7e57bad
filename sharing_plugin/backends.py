"""Which NVML the process talks to, chosen once at the entry from a ``--gpus`` SPEC.

``nvml`` is the real `pynvml` module; ``simulated:PRESET`` and ``simulated:PATH`` are the
in-package simulator of the same surface. Nothing below the entry chooses: the daemon and the
`plan` command are handed the module, so real adapters never import the simulator.

Both are returned as an `NvmlApi`: mypy checks here that the simulator has every call the
adapters make; pynvml is untyped (``Any`` to mypy), so a unit test checks it member by member.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from sharing_plugin.config.memory import HOOK_PATH_ENV
from sharing_plugin.config.options import DRIVER_ROOT_ENV
from sharing_plugin.daemon.node.options import SourceOptions
from sharing_plugin.errors import ConfigError, Problem
from sharing_plugin.nvml.api import NvmlApi


def backend_from_spec(spec: str) -> NvmlApi:
    """The pynvml-like module for a ``--gpus`` SPEC: ``nvml``, ``simulated:PRESET|PATH``."""
    if spec == "nvml":
        import pynvml

        real: NvmlApi = pynvml  # untyped: checked against the Protocol by a unit test
        return real
    from sharing_plugin.sim.nvml.node import preset_names

    kind, sep, target = spec.partition(":")
    if kind != "simulated" or not sep or not target:
        raise ConfigError(
            [
                Problem(
                    path="--gpus",
                    message=(
                        f"unknown GPU backend '{spec}': use 'nvml', 'simulated:<preset>' "
                        f"(one of {', '.join(preset_names())}) or 'simulated:<node file>'"
                    ),
                )
            ]
        )
    from sharing_plugin.sim.nvml.simulated import SimulatedNvml

    simulated: NvmlApi  # where mypy checks that the simulator fits the Protocol
    path = Path(target)
    if target in preset_names():
        simulated = SimulatedNvml.from_preset(target)
    elif path.exists() or path.suffix in (".yaml", ".yml"):
        simulated = SimulatedNvml.from_file(path)
    else:
        simulated = SimulatedNvml.from_preset(target)  # raises, listing the presets
    return simulated


def names_node_file(spec: str) -> bool:
    """Whether SPEC names an existing node description file (bad content is invalid input)."""
    kind, _, target = spec.partition(":")
    return kind == "simulated" and Path(target).is_file()


def cgroup_version(spec: str, backend: NvmlApi) -> int | None:
    """The cgroup hierarchy of the node behind SPEC: a simulated node's own `cgroupVersion`,
    else the host's."""
    if spec.startswith("simulated:"):
        from sharing_plugin.sim.nvml.simulated import SimulatedNvml

        assert isinstance(backend, SimulatedNvml)
        return backend.cgroup_version
    from sharing_plugin.sources.host import host_cgroup_version

    return host_cgroup_version()


def serving_backend(source: SourceOptions) -> tuple[NvmlApi, SourceOptions]:
    """The NVML of a serving command, and its source options with what the node says of
    itself filled in (the cgroup hierarchy, the CDI hook's default path, the driver root)."""
    backend = backend_from_spec(source.gpus)
    found = replace(
        source,
        cgroup_version=cgroup_version(source.gpus, backend),
        hook_path_default=os.environ.get(HOOK_PATH_ENV),
        driver_root_default=os.environ.get(DRIVER_ROOT_ENV) or None,
    )
    return backend, found
