"""What tests read of the product's state that the product itself never reads.

The wheel ships no member that only tests call: each observation point tests need is here, one
function per point, reading the object's own state. A rename inside the product breaks this
module under `mypy --strict`, in one place, instead of every test that looks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from sharing_plugin.daemon.node.health_monitor import HealthMonitor
from sharing_plugin.daemon.node.pipeline import NodePipeline
from sharing_plugin.daemon.node.tasks import TaskOwner
from sharing_plugin.daemon.run.supervisor import Supervisor
from sharing_plugin.daemon.run_dra.pool import PoolKeeper
from sharing_plugin.kubelet.server import ResourceServer
from sharing_plugin.plan.model import Plan
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


def health_monitor(pipeline: NodePipeline) -> HealthMonitor | None:
    """The GPU health monitor, once a config with GPUs has been applied."""
    return pipeline._health_monitor


def tasks(owner: TaskOwner) -> frozenset[asyncio.Task[object]]:
    """The tasks `owner` holds now."""
    return frozenset(owner._tasks)


async def wait_published(
    keeper: PoolKeeper,
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
