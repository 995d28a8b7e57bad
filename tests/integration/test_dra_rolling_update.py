"""Two `run-dra` instances over one node at once (a DaemonSet rolling update with `maxSurge: 1,
maxUnavailable: 0`), against the DRA kubelet simulator (which keeps every instance and calls the
newest, as the 1.33+ kubelet does; tests/e2e proves it against the real one).

The checkpoint and the claims' CDI spec files are shared: whichever instance prepares or
unprepares a claim, none is lost and none undone twice, and the old instance leaving unprepares,
deletes and clears nothing the new one serves.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import lightkube
import pytest
from dra_harness import DRIVER, DraRun, dra_running

from sharing_plugin.daemon.run_dra.driver import DraDriver
from sharing_plugin.dra.api.dra_health.v1alpha1 import api_pb2 as health
from sharing_plugin.dra.api.dra_health.v1alpha1 import api_pb2_grpc as health_grpc
from sharing_plugin.dra.checkpoint import Checkpoint, checkpoint_path
from sharing_plugin.dra.claims import ClaimRef

SHARED = "nvidia.com/gpu.shared"
CONFIG = (
    "version: v1\ndra:\n  sharedDevices: replicas\nsharing:\n  timeSlicing:\n"
    "    renameByDefault: true\n    resources:\n      - name: gpu\n        replicas: 4\n"
)


def spec_file(root: Path, ref: ClaimRef) -> Path:
    return root / "cdi" / f"{DRIVER}-claim_{ref.uid}.json"


@asynccontextmanager
async def second_instance(run: DraRun, kubeconfig: Path) -> AsyncIterator[DraDriver]:
    """A second `run-dra` with the first one's options, once the kubelet knows both and calls
    the new one (a rolling update's surge instance)."""
    client = lightkube.AsyncClient(config=lightkube.KubeConfig.from_file(kubeconfig))
    new = DraDriver(run.daemon.options, nvml=run.nvml, kube_client=client)
    try:
        async with new:
            async with asyncio.timeout(5):
                while len(run.kubelet.instances.get(DRIVER, ())) < 2:  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
            assert new.server is not None
            assert run.kubelet.plugins[DRIVER].endpoint == str(new.server.endpoint)
            yield new
    finally:
        await client.close()


async def test_two_instances_share_the_claims_and_the_old_one_leaves_without_a_gap(
    short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sharing_plugin.dra.prepare")
    async with dra_running(short_dir, CONFIG, clear_slices_on_exit=True) as run:
        old = run.daemon
        before = await run.published(32)
        first = run.claim("first", SHARED)
        assert (await run.prepare(first)).error == ""
        async with second_instance(run, short_dir / "kubeconfig") as new:
            assert new.preparer is not None and old.preparer is not None
            second, third = run.claim("second", SHARED), run.claim("third", SHARED)
            assert (await run.prepare(second)).error == ""  # the kubelet calls the new one

            # Interleaved: each instance prepares and unprepares claims the other prepared.
            prepared, unprepared = await asyncio.gather(
                old.preparer.prepare([third]), new.preparer.unprepare([first])
            )
            assert prepared[third.uid].error == "" and unprepared[first.uid] == ""
            assert set(old.preparer.prepared) == set(new.preparer.prepared)
            assert set(new.preparer.prepared) == {second.uid, third.uid}
            # Both asked to unprepare one claim: it is undone once, both answer success.
            answers = await asyncio.gather(
                old.preparer.unprepare([second]), new.preparer.unprepare([second])
            )
            assert answers == [{second.uid: ""}, {second.uid: ""}]
            undone = [r for r in caplog.records if second.uid in r.getMessage()]
            assert [r.getMessage().split(" ")[0] for r in undone] == ["prepared", "unprepared"]
            assert not spec_file(short_dir, first).exists()
            assert not spec_file(short_dir, second).exists()

            # The old one leaves (with --clear-slices-on-exit): the new one keeps serving.
            await old.close()
            assert not old.server.endpoint.exists()
            assert new.server.endpoint.exists() and new.server.registration_path.exists()
            assert run.kubelet.plugins[DRIVER].endpoint == str(new.server.endpoint)
            assert len(run.devices()) == len(before)
            fourth = run.claim("fourth", SHARED)
            assert (await run.prepare(fourth)).error == ""
            assert await run.unprepare(third) == ""  # prepared by the old one
            held = Checkpoint(checkpoint_path(short_dir, DRIVER)).load()
            assert set(held) == {fourth.uid}
            assert json.loads(spec_file(short_dir, fourth).read_text())["devices"]


async def test_the_new_instance_tells_the_health_again_when_the_old_one_leaves(
    short_dir: Path,
) -> None:
    """The 1.36 kubelet forgets the driver's device health when any instance's health stream
    ends (it showed the devices Unknown on the real cluster): the instance that stays sends
    the list again once the other left, instead of at its next resend a minute later."""
    async with dra_running(short_dir, CONFIG) as run:
        old = run.daemon
        await run.published(32)
        async with second_instance(run, short_dir / "kubeconfig") as new:
            assert new.server is not None
            call = health_grpc.DRAResourceHealthStub(
                run.kubelet.plugins[DRIVER].channel
            ).NodeWatchResources(health.NodeWatchResourcesRequest())
            try:
                first = await asyncio.wait_for(call.read(), 2)
                await old.close()
                again = await asyncio.wait_for(call.read(), 6)
            finally:
                call.cancel()
            assert len(first.devices) == 32
            assert [(d.device, d.health) for d in again.devices] == [
                (d.device, d.health) for d in first.devices
            ]


_WRITER = """
import sys
from pathlib import Path
from sharing_plugin.dra.checkpoint import Checkpoint, PreparedClaim
from sharing_plugin.dra.claims import ClaimRef

checkpoint, prefix = Checkpoint(Path(sys.argv[1])), sys.argv[2]
for n in range(int(sys.argv[3])):
    uid = f"{prefix}-{n}"
    claim = PreparedClaim(ClaimRef("default", uid, uid), (), f"{uid}.json", ())
    checkpoint.update(lambda claims: claims.__setitem__(uid, claim))
    if n % 2:
        checkpoint.update(lambda claims: claims.pop(f"{prefix}-{n - 1}"))
"""


@pytest.mark.subprocess
async def test_two_processes_writing_the_checkpoint_lose_no_claim(tmp_path: Path) -> None:
    """Each process adds claims and removes every other one of its own, by read-merge-write
    of the one file: none of the other's is lost, none removed twice (a pop that misses
    raises)."""
    path = tmp_path / "checkpoint.json"
    workers = [
        await asyncio.create_subprocess_exec(sys.executable, "-c", _WRITER, str(path), p, "80")
        for p in ("a", "b")
    ]
    assert [await asyncio.wait_for(w.wait(), 60) for w in workers] == [0, 0]
    left = set(Checkpoint(path).load())
    assert left == {f"{p}-{n}" for p in ("a", "b") for n in range(1, 80, 2)}
