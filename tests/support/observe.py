"""What tests read of the product's state that the product itself never reads.

The wheel ships no member that only tests call: each observation point tests need is here, one
function per point, reading the object's own state. A rename inside the product breaks this
module under `mypy --strict`, in one place, instead of every test that looks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

import pynvml

from sharing_plugin.daemon.node.health_monitor import HealthMonitor
from sharing_plugin.daemon.node.outcome import Applied, Outcome, Outcomes, Rejected
from sharing_plugin.daemon.node.pipeline import NodePipeline
from sharing_plugin.daemon.run.supervisor import Supervisor
from sharing_plugin.daemon.run_dra.pool import PoolWriter
from sharing_plugin.gpus.catalog import MigProfileSpec
from sharing_plugin.kit.tasks import TaskOwner
from sharing_plugin.kubelet.server import ResourceServer
from sharing_plugin.nvml.calls import error_name
from sharing_plugin.plan.model import Plan
from sharing_plugin.sim.kubelet.simulator import KubeletSimulator
from sharing_plugin.sim.nvml.mig import SimMigOps
from sharing_plugin.sim.nvml.node import Fault, LoadedNode, preset_names
from sharing_plugin.sim.nvml.simulated import SimulatedNvml
from sharing_plugin.sim.nvml.state import SimGpu
from sharing_plugin.views.dra_api import PublishedDevice


def resource_names(plan: Plan) -> tuple[str, ...]:
    """The plan's resource names, in its order."""
    return tuple(r.name for r in plan.resources)


def servers(supervisor: Supervisor) -> Mapping[str, ResourceServer]:
    """Resource name -> the device plugin server serving it now."""
    return dict(supervisor._servers)


def open_streams(server: ResourceServer) -> int:
    """ListAndWatch streams kubelet holds open on the server's current socket."""
    listener = server._listener
    return len(listener.servicer._streams) if listener is not None else 0


def unconfirmed_grants(supervisor: Supervisor) -> dict[str, frozenset[str]]:
    """Per resource, IDs Allocate granted that PodResources has not shown yet (counted as held
    meanwhile)."""
    outstanding = supervisor._grants.outstanding()
    return {r: frozenset(d.id for d in ds) for r, ds in outstanding.items()}


def health_monitor(pipeline: NodePipeline[object]) -> HealthMonitor | None:
    """The GPU health monitor, once a config with GPUs has been applied."""
    return pipeline._health.monitor


def tasks(owner: TaskOwner) -> frozenset[asyncio.Task[object]]:
    """The tasks `owner` holds now."""
    return frozenset(owner._tasks)


async def wait_published(
    keeper: PoolWriter,
    predicate: Callable[[tuple[PublishedDevice, ...]], bool],
    timeout: float = 5.0,  # noqa: ASYNC109
) -> tuple[PublishedDevice, ...]:
    """What `keeper` published, once it satisfies `predicate` (TimeoutError otherwise): woken
    by the keeper after each publish, never by a clock."""

    def done() -> bool:
        published = keeper.publisher.published
        return published is not None and predicate(published)

    async with asyncio.timeout(timeout), keeper._published:
        await keeper._published.wait_for(done)
    published = keeper.publisher.published
    assert published is not None
    return published


async def first_outcome(
    outcomes: Outcomes,
    predicate: Callable[[Outcome], bool],
    timeout: float = 5.0,  # noqa: ASYNC109
) -> Outcome:
    """The first outcome of the subscription that satisfies `predicate` (earlier ones are
    passed over); TimeoutError if none comes within `timeout` seconds in all."""
    async with asyncio.timeout(timeout):
        while not predicate(outcome := await outcomes.next(timeout)):
            pass
        return outcome


async def next_applied(outcomes: Outcomes, timeout: float = 5.0) -> Applied:  # noqa: ASYNC109
    """The next `Applied` (rejections on the way are passed over)."""
    return await _next_of(outcomes, Applied, timeout)


async def next_rejected(outcomes: Outcomes, timeout: float = 5.0) -> Rejected:  # noqa: ASYNC109
    """The next `Rejected` (applied configs on the way are passed over)."""
    return await _next_of(outcomes, Rejected, timeout)


_O = TypeVar("_O", Applied, Rejected)


async def _next_of(outcomes: Outcomes, kind: type[_O], timeout: float) -> _O:  # noqa: ASYNC109
    outcome = await first_outcome(outcomes, lambda o: isinstance(o, kind), timeout)
    assert isinstance(outcome, kind)
    return outcome


# --- the simulators: what only tests do to them or read of them ------------------------------


def inject_xid(nvml: SimulatedNvml, gpu: int | str, xid: int) -> None:
    """One Xid event on `gpu` (index or UUID; a MIG UUID is attributed to its instance)."""
    nvml.inject(Fault(gpu=gpu, xid=xid))


def inject_ecc(
    nvml: SimulatedNvml, gpu: int | str, kind: Literal["double", "single"] = "double"
) -> None:
    """One ECC error event on `gpu` (index or UUID; a MIG UUID names its GPU)."""
    nvml.inject(Fault(gpu=gpu, ecc=kind))


def set_lost(nvml: SimulatedNvml, gpu: int | str, lost: bool = True) -> None:
    """`gpu` falls off the bus (or comes back with `lost=False`)."""
    nvml.inject(Fault(gpu=gpu, lost=lost))


def wait_until_shut_down(nvml: SimulatedNvml, timeout: float) -> bool:
    """Wait until every nvmlInit has had its nvmlShutdown; False if `timeout` s passed first.
    A closed event watch ends its session only when its current wait returns."""
    with nvml._shut_down:
        return nvml._shut_down.wait_for(lambda: nvml._init_count == 0, timeout)


def reset_gpu(nvml: SimMigOps, index: int) -> None:
    """What ``nvidia-smi -r`` does to the simulated GPU: a pending MIG mode becomes current."""
    gpu = nvml.gpus[index]
    gpu.mig_current = gpu.mig_pending


def messages_received(kubelet: KubeletSimulator, resource: str) -> int:
    """How many ListAndWatch messages the kubelet has received for `resource` so far."""
    return kubelet._messages.get(resource, 0)


def numa_nodes(kubelet: KubeletSimulator, resource: str) -> dict[str, tuple[int, ...]]:
    """Device ID -> the NUMA nodes the plugin advertised it on, as the kubelet holds them."""
    state = kubelet._resources.get(resource)
    return dict(state.numa) if state else {}


def drop_before_stream(kubelet: KubeletSimulator, resource: str, times: int = 1) -> None:
    """Make the simulated kubelet accept the next `times` registrations of `resource`
    (dial-back and options included), then drop each before its ListAndWatch stream opens: the
    resource's devices count Unhealthy, and nothing ends on the plugin's side."""
    kubelet._drops[resource] = kubelet._drops.get(resource, 0) + times


@dataclass(frozen=True, slots=True)
class MigCall:
    """One MIG-changing NVML call the simulator received, and how it ended."""

    op: str  # "create_gpu_instance", "destroy_gpu_instance", "create_compute_instance", ...
    gpu: int
    profile: str | None  # GPU-instance profile name, when the call concerns one
    start: int | None
    result: str  # "SUCCESS" or the NVML_ERROR_* name


class RecordingNvml(SimulatedNvml):
    """The simulated NVML that also keeps every MIG-changing call it received, in `mig_calls`
    (tests of code that partitions GPUs read and clear it)."""

    def __init__(self, node: LoadedNode, *, mig_mode_needs_reset: bool = False) -> None:
        self.mig_calls: list[MigCall] = []
        super().__init__(node, mig_mode_needs_reset=mig_mode_needs_reset)

    def _mig_call_ended(
        self, op: str, gpu: SimGpu, spec: MigProfileSpec | None, start: int | None, code: int
    ) -> None:
        result = "SUCCESS" if code == pynvml.NVML_SUCCESS else error_name(pynvml, code)
        self.mig_calls.append(MigCall(op, gpu.index, spec.name if spec else None, start, result))


def recording_backend(spec: str) -> RecordingNvml:
    """What `backend_from_spec` makes of a ``simulated:PRESET|PATH`` SPEC, recording."""
    kind, _, target = spec.partition(":")
    assert kind == "simulated", f"{spec} names no simulated node"
    path = Path(target)
    if target not in preset_names() and (path.exists() or path.suffix in (".yaml", ".yml")):
        return RecordingNvml.from_file(path)
    return RecordingNvml.from_preset(target)
