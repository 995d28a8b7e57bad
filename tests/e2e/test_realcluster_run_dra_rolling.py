"""A rolling update of `run-dra` with `maxSurge: 1, maxUnavailable: 0` on a real one-node
cluster (tests/realcluster.py, Kubernetes 1.36: scheduler, controllers and the kubelet's DRA
manager): the new instance registers while the old one serves, pods with claims come and go
while both serve, then the old one stops (SIGTERM). Every pod runs and every deletion completes;
the pool's ResourceSlices are replaced in place once, by the new instance's first publish (same
objects, same devices, a newer generation) and never deleted; a claim prepared through the old
instance keeps its CDI spec and is unprepared through the new one; no claim is prepared twice.
The kubelet forgets the driver's device health when the old instance's health stream ends; the
new instance tells it again, so the pods' devices show Healthy, not Unknown, within seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import realcluster
from lightkube.resources.core_v1 import Pod
from realapi_support import observed
from realcluster_state import slices_when
from realcluster_support import (
    CLUSTER_TEST_MARKS,
    DEPLOY_DRA,
    DRIVER,
    SLICE,
    OnNode,
    on_node,
    sliced,
)

from sharing_plugin.dra.checkpoint import Checkpoint, checkpoint_path
from sharing_plugin.dra.resources import resource_class

pytestmark = CLUSTER_TEST_MARKS

T4X4 = "simulated:t4x4"  # four GPUs, two shares each: eight devices
CLAIM = resource_class("resource.k8s.io/v1", "ResourceClaim")
TEMPLATE = "one-gpu"
REGISTERED = "registered with the kubelet as DRA driver"


async def test_claims_are_prepared_and_unprepared_throughout_a_rolling_update(
    real_cluster: realcluster.RealCluster, short_dir: Path
) -> None:
    async with on_node(real_cluster, short_dir, DEPLOY_DRA) as node:
        await node.configure(sliced(2))
        namespace = await node.namespace()
        await node.claim_template(namespace, TEMPLATE, f"gpu.{DRIVER}")
        cdi = Path(node.env["CDI_DIR"])
        pods = Pods(node, namespace)
        async with slice_writes(node) as writes, node.plugin(T4X4, command="run-dra") as old:
            await old.wait_for_line(REGISTERED, timeout=20)
            before = await slices_when(node, bool)
            await pods.run("a1", "a2")  # prepared through the old instance
            async with node.plugin(T4X4, command="run-dra") as new:
                await new.wait_for_line(REGISTERED, timeout=20)
                assert "another instance of DRA driver" in new.stderr()
                both = registrations(node)
                assert len(both) == 2, both
                # The new instance's first publish: the pool at the next generation.
                await slices_when(node, lambda s: generations(s) == {generations(before).pop() + 1})
                # Both serve: new claims prepared, old ones unprepared, none fails.
                created = asyncio.ensure_future(pods.run("b1", "b2"))
                await pods.gone("a2")
                await created
                # The old instance stops (SIGTERM) while a pod is being placed.
                stopping = asyncio.ensure_future(old.stop(timeout=10))
                await pods.run("c1")
                assert await stopping == 0, old.stderr()
                assert "leaving the ResourceSlices to the other instance" in old.stderr()
                assert registrations(node) < both, both  # only its own registration went
                await pods.run("c2")
                for name in ("a1", "b1", "b2", "c1"):
                    await node.running(namespace, name, within=1)
                # The kubelet forgot the driver's device health as the old instance's stream
                # ended (c2's devices showed Unknown); the new instance tells it again.
                for name in ("a1", "b1", "b2", "c1", "c2"):
                    await node.pod_when(namespace, name, devices_healthy, within=10)
                # The old instance's claim kept its spec for its pod; the new one unprepares it.
                a1 = pods.uids["a1"]
                assert json.loads(spec_file(cdi, a1).read_text())["devices"]
                await pods.gone("a1")
                held = Checkpoint(checkpoint_path(node.cluster.kubelet_root, DRIVER)).load()
                assert set(held) == {pods.uids[n] for n in ("b1", "b2", "c1", "c2")}
                # Each claim prepared once, by one instance or the other; a1's and a2's
                # unprepared once.
                logs = old.stderr() + new.stderr()
                for name, uid in pods.uids.items():
                    prepared = re.findall(rf"(?<!un)prepared ResourceClaim \S+ \({uid}\)", logs)
                    unprepared = re.findall(rf"unprepared ResourceClaim \S+ \({uid}\)", logs)
                    assert (len(prepared), len(unprepared)) == (1, name in ("a1", "a2")), name
                assert_replaced_once_in_place(before, await slices_when(node, bool), writes)
                assert await new.stop(timeout=10) == 0, new.stderr()


class Pods:
    """The test's pods (one claim each, from the template) and their claims' UIDs."""

    def __init__(self, node: OnNode, namespace: str) -> None:
        self.node = node
        self.namespace = namespace
        self.uids: dict[str, str] = {}

    async def run(self, *names: str) -> None:
        """The pods created, running, their claims' CDI specs what the runtime was told."""
        for name in names:
            await self.node.pod(self.namespace, name, {}, template=TEMPLATE)
        for name in names:
            pod = await self.node.running(self.namespace, name, within=20)
            (status,) = pod["status"]["resourceClaimStatuses"]
            claim = await self.node.client.get(
                CLAIM, status["resourceClaimName"], namespace=self.namespace
            )
            uid = str(claim.metadata.uid)
            self.uids[name] = uid
            told = set(self.node.created(pod)["cdi_devices"])
            spec = json.loads(spec_file(Path(self.node.env["CDI_DIR"]), uid).read_text())
            assert told == {f"{spec['kind']}={d['name']}" for d in spec["devices"]}, name

    async def gone(self, name: str) -> None:
        """The pod deleted: gone from the API, its claim deleted and unprepared."""
        await self.node.client.delete(Pod, name, namespace=self.namespace)
        claim_gone = asyncio.ensure_future(
            observed(
                self.node.client,
                CLAIM,
                lambda claims: not any(c.metadata.uid == self.uids[name] for c in claims.values()),
                namespace=self.namespace,
                within=30,
            )
        )
        await observed(
            self.node.client,
            Pod,
            lambda pods: name not in pods,
            namespace=self.namespace,
            within=30,
        )
        await claim_gone
        spec = spec_file(Path(self.node.env["CDI_DIR"]), self.uids[name])
        async with asyncio.timeout(10):  # the kubelet unprepares once the containers are gone
            while spec.exists():  # noqa: ASYNC110 -- a file
                await asyncio.sleep(0.05)


def devices_healthy(pod: dict[str, Any]) -> bool:
    """Whether the pod's status shows every device it holds Healthy (the kubelet's
    `allocatedResourcesStatus`, from the driver's health stream)."""
    found = [
        resource["health"]
        for container in pod["status"].get("containerStatuses") or ()
        for status in container.get("allocatedResourcesStatus") or ()
        for resource in status["resources"]
    ]
    return bool(found) and set(found) == {"Healthy"}


def spec_file(cdi: Path, uid: str) -> Path:
    return cdi / f"{DRIVER}-claim_{uid}.json"


@contextlib.asynccontextmanager
async def slice_writes(node: OnNode) -> AsyncIterator[list[tuple[str, dict[str, Any]]]]:
    """Every change to the node's ResourceSlices while the block runs, as the watch tells it."""
    fields = {"spec.nodeName": node.name}
    listing = node.client.list(SLICE, fields=fields)
    async for _ in listing:
        pass
    seen: list[tuple[str, dict[str, Any]]] = []

    async def watch() -> None:
        version = listing.resourceVersion
        async for event, obj in node.client.watch(SLICE, fields=fields, resource_version=version):
            seen.append((event, obj.to_dict()))

    task = asyncio.ensure_future(watch())
    try:
        yield seen
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def registrations(node: OnNode) -> set[str]:
    """The registration sockets of the driver's instances in the kubelet's plugins_registry."""
    return {p.name for p in (node.cluster.kubelet_root / "plugins_registry").glob(f"{DRIVER}-*")}


def generations(slices: dict[str, dict[str, Any]]) -> set[int]:
    return {int(s["spec"]["pool"]["generation"]) for s in slices.values()}


def assert_replaced_once_in_place(
    before: dict[str, dict[str, Any]],
    now: dict[str, dict[str, Any]],
    writes: list[tuple[str, dict[str, Any]]],
) -> None:
    """The slices the old instance published (`before`) were written once since, by the new
    instance's first publish: the same objects with the same devices, at the next generation;
    none was deleted, and `now` is that write."""
    assert [event for event, _ in writes if event == "DELETED"] == [], writes
    assert now.keys() == before.keys(), (before.keys(), now.keys())
    for name, old in before.items():
        ours = [s for _, s in writes if s["metadata"]["name"] == name]
        versions = [s["metadata"]["resourceVersion"] for s in ours]
        since = ours[versions.index(old["metadata"]["resourceVersion"]) + 1 :]
        assert len(since) == 1, [s["spec"]["pool"] for s in since]
        (new,) = since
        assert new["metadata"]["uid"] == old["metadata"]["uid"]  # replaced, not re-created
        assert new["spec"]["pool"]["generation"] == old["spec"]["pool"]["generation"] + 1
        assert new["spec"]["devices"] == old["spec"]["devices"]
        assert now[name]["metadata"]["resourceVersion"] == new["metadata"]["resourceVersion"]
