"""Run the real daemon in-process against the kubelet simulator, for integration tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml_fast
from support.observe import recording_backend

from sharing_plugin.backends import backend_from_spec, cgroup_version
from sharing_plugin.daemon.node.options import NodeReportOptions, SourceOptions
from sharing_plugin.daemon.run.app import NodeDevicePlugin
from sharing_plugin.daemon.run.options import RunOptions
from sharing_plugin.sim.kubelet.simulator import KubeletSimulator


async def eventually(predicate: Callable[[], bool], within: float = 5.0) -> None:
    """Wait for a condition on the daemon's own state, which has no change notification of its
    own (kubelet-side conditions use the simulator's `wait_for`, which is event-driven)."""
    async with asyncio.timeout(within):
        while not predicate():  # noqa: ASYNC110 -- the daemon's state has no event to wait on
            await asyncio.sleep(0.01)


_SOURCE_FIELDS = frozenset(f.name for f in fields(SourceOptions))
_REPORT_FIELDS = frozenset(f.name for f in fields(NodeReportOptions))


def run_options(**flat: Any) -> RunOptions:
    """`RunOptions` from one flat set of keywords, each put in the part of the options it
    belongs to (`config_path=`, `node_name=` are the source's; `node_status=` the report's)."""
    source = {k: flat.pop(k) for k in list(flat) if k in _SOURCE_FIELDS}
    report = {k: flat.pop(k) for k in list(flat) if k in _REPORT_FIELDS}
    return RunOptions(source=SourceOptions(**source), report=NodeReportOptions(**report), **flat)


def flat_options(options: RunOptions) -> dict[str, Any]:
    """The keywords `run_options` takes to make `options` again."""
    flat = {f.name: getattr(options, f.name) for f in fields(options)}
    for part in ("source", "report"):
        nested = flat.pop(part)
        flat.update({f.name: getattr(nested, f.name) for f in fields(nested)})
    return flat


def node_file(root: Path, description: dict[str, Any]) -> Path:
    """A simulated node's description, written as `root/node.yaml` (`--gpus simulated:PATH`)."""
    path = root / "node.yaml"
    path.write_text(yaml_fast.dump(description), encoding="utf-8")
    return path


def append_fault(path: Path, fault: dict[str, Any]) -> None:
    """Append one entry to the node file's `faults`, replacing the file in one rename."""
    data = yaml_fast.load(path.read_text(encoding="utf-8"))
    data["faults"] = [*(data.get("faults") or []), fault]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml_fast.dump(data), encoding="utf-8")
    tmp.replace(path)


@dataclass
class Running:
    kubelet: KubeletSimulator
    daemon: NodeDevicePlugin
    config: Path
    nvml: Any

    def in_sync(self) -> bool:
        """Kubelet sees exactly what the supervisor advertises, for every resource."""
        plan = self.daemon.supervisor.advertised
        if plan is None or not plan.resources:
            return False
        return all(
            self.kubelet.devices(r.name) == {d.id: d.health.value for d in r.devices}
            for r in plan.resources
        )

    async def settled(self, within: float = 5.0) -> None:
        await self.kubelet.wait_for(self.in_sync, timeout=within)

    def capacity(self) -> dict[str, int]:
        return {r: self.kubelet.capacity(r) for r in self.kubelet.resources()}

    def allocatable(self) -> dict[str, int]:
        return {r: self.kubelet.allocatable(r) for r in self.kubelet.resources()}

    def write(self, text: str) -> None:
        """Replace the config file's content the way an editor saving it would."""
        tmp = self.config.with_name(self.config.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(self.config)


@asynccontextmanager
async def running(
    root: Path,
    config_text: str | None,
    *,
    gpus: str = "simulated:dgx-a100-80gb",
    config_path: Path | None = None,
    wait_ready: bool = True,
    kube_client: Any = None,
    **options: Any,
) -> AsyncIterator[Running]:
    """A kubelet simulator in `root` and the daemon serving `config_text` (None: no config)."""
    config = config_path or root / "config.yaml"
    if config_text is not None:
        config.write_text(config_text, encoding="utf-8")
    nvml = recording_backend(gpus) if gpus.startswith("simulated:") else backend_from_spec(gpus)
    opts = run_options(
        config_path=config if (config_text is not None or config_path) else None,
        gpus=gpus,
        kubelet_dir=root,
        # What the entry finds of the node (the simulated node's own cgroup hierarchy).
        **{"drain_recheck_s": 0.05, "cgroup_version": cgroup_version(gpus, nvml), **options},
    )
    async with (
        KubeletSimulator(root, grace_period=0.2, dial_timeout=2.0) as kubelet,
        NodeDevicePlugin(opts, nvml=nvml, kube_client=kube_client) as daemon,
    ):
        run = Running(kubelet=kubelet, daemon=daemon, config=config, nvml=nvml)
        if wait_ready:
            await run.settled()
        yield run
