"""What a serving command and the node pipeline say to each other.

A command tells its pipeline which steps beyond config -> plan it has (`PipelineOptions`) and
is its `PlanConsumer`: it is handed a `NodeView` for every change and never reads the pipeline
back. `check` returns whatever `apply` needs, so a value found while checking is the one served
(`run-dra`'s pool), with nothing carried between the two in the consumer itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

from sharing_plugin.daemon.node.health_monitor import HealthEnv
from sharing_plugin.daemon.node.options import NodeReportOptions
from sharing_plugin.daemon.node.outcome import NodeView, Served
from sharing_plugin.gpus.holders import Holder
from sharing_plugin.gpus.inventory import Inventory

HeldBy = Callable[[Inventory], Awaitable[Mapping[str, Holder] | None]]
"""Which MIG devices of the node (as the inventory given says it is) are held, and by whom
(None: unknown): PodResources for `run`, prepared claims in DRA."""

Checked = TypeVar("Checked")
"""What a consumer's `check` found, handed to its `apply`."""


@dataclass(frozen=True, slots=True)
class PipelineOptions:
    """What a command's pipeline does beyond config -> plan: GPU health watching
    (`health_env`: `run`, `run-dra`), carrying out `partitioning.mig` (`mig_held_by`: which MIG
    devices are held, retried every `mig_retry_s` while a layout waits; `dynamic_mig`: why
    dynamic entries cannot be served now, None when they are (MIG mode turned on, the
    instances left to the command); without it a config with one is rejected naming
    `run-dra`), `run`'s Node status and GFD labels (`node_report`)."""

    health_env: HealthEnv | None = None
    mig_held_by: HeldBy | None = None
    mig_retry_s: float = 2.0
    dynamic_mig: Callable[[], str | None] | None = None
    node_report: NodeReportOptions | None = None


PLAIN_PIPELINE = PipelineOptions()
"""Config to plan only (`mps-control`)."""


class PlanConsumer(Protocol[Checked]):
    """What a serving command does with the pipeline's values (called under its lock)."""

    def check(self, node: NodeView) -> Checked:
        """What serving `node` takes, found before anything changes; raise PlanError if it
        cannot be served: the config is then rejected and the consumer keeps serving the last
        one. The pipeline's MIG step has already run (the plan is of the node it made)."""

    async def apply(self, node: NodeView, checked: Checked) -> Served:
        """Serve `node.applied` (a new config, or the last good one on a changed node), with
        what `check(node)` returned."""

    async def serve_again(self, node: NodeView) -> None:
        """The node changed under the `Applied` being served (GPU health, a MIG instance made
        for a claim), or the consumer asked (`NodePipeline.serve_again`): serve `node`."""
