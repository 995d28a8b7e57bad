"""run-dra in-process, `dra.sharedDevices: capacity`: a replicas edit while claims hold the old
share waits for them, and the Node hears it once per change of that situation (Events through
the fake API server, as `run`'s are filed), besides `/status` `dra.oldShares`; each claim counted
at the memory its allocation consumed (the test allocator fills `consumedCapacity` as the
scheduler does), or, from a checkpoint of an earlier version, at the share it was placed at."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from dra_harness import DRIVER, NODE, DraRun, dra_running
from support.observe import wait_published

from sharing_plugin.dra.checkpoint import checkpoint_path

SHARED = "nvidia.com/gpu.shared"
SHARE_AT_4, SHARE_AT_5 = 20480, 16384  # MiB of an 80 GiB A100 at 4 and 5 replicas


def on_gpu(index: int) -> str:
    return f'device.attributes["{DRIVER}"].index == {index}'


def by_capacity(replicas: int) -> str:
    return (
        "version: v1\n"
        "dra:\n"
        "  sharedDevices: capacity\n"
        "sharing:\n"
        "  timeSlicing:\n"
        "    renameByDefault: true\n"
        "    resources:\n"
        "      - name: gpu\n"
        f"        replicas: {replicas}\n"
    )


def old_shares(run: DraRun) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = run.daemon.status.to_json()["dra"]["oldShares"]
    return found


async def once_old_shares(run: DraRun, count: int) -> list[dict[str, Any]]:
    """`dra.oldShares` once it lists `count` devices (woken by each publish), with every Node
    event reported until then written."""
    await wait_published(run.keeper, lambda _: len(old_shares(run)) == count)
    assert run.daemon.node_events is not None
    await run.daemon.node_events.flush()
    return old_shares(run)


def node_events(run: DraRun) -> list[dict[str, Any]]:
    return [e for e in run.api.events("default") if e["involvedObject"]["name"] == NODE]


async def test_a_replicas_edit_waiting_for_claims_is_one_node_event_and_its_end_another(
    short_dir: Path,
) -> None:
    async with dra_running(short_dir, by_capacity(4)) as run:
        await run.published(8)
        first = run.claim("first", SHARED, selectors=[on_gpu(0)])
        second = run.claim("second", SHARED, selectors=[on_gpu(1)])
        for ref in (first, second):
            assert (await run.prepare(ref)).error == ""
        held = {d["device"] for ref in (first, second) for d in (await run.prepare(ref)).devices}
        uuids = {
            d["name"]: d["attributes"]["uuid"]["string"] for d in run.devices() if d["name"] in held
        }
        assert len(uuids) == 2  # one claim on each of two GPUs

        run.write(by_capacity(5))
        waiting = await once_old_shares(run, 2)
        assert {w["uuid"] for w in waiting} == set(uuids.values())
        (event,) = node_events(run)
        assert event["reason"] == "ConfigWaitsForClaims" and event["type"] == "Warning"
        assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": NODE}
        message = event["message"]
        for uuid in uuids.values():
            assert uuid in message
        # Both GPUs wait for the same thing: one group, its claims counted together; each
        # has 61440 MiB free, three new shares.
        assert (
            f"2 claim(s) hold the old share ({SHARE_AT_4} MiB), the config's share is "
            f"{SHARE_AT_5} MiB (5 per device), 6 new share(s) fit now"
        ) in message
        assert "takes full effect as the claims holding the old share are released" in message
        assert "/status dra.oldShares" in message

        # A re-read of the same config, and one of the two claims going: the situation
        # changes only in its counts (`/status` follows), so the Node hears nothing more.
        run.daemon.request_reload()
        assert await run.unprepare(first) == ""
        (left,) = await once_old_shares(run, 1)
        assert left["oldShareClaims"] == 1
        assert [(e["reason"], e["count"]) for e in node_events(run)] == [
            ("ConfigWaitsForClaims", 1)
        ]

        # The last one going: the edit took full effect, said once as a Normal event.
        assert await run.unprepare(second) == ""
        await once_old_shares(run, 0)
        events = node_events(run)
        assert [(e["reason"], e["type"], e["count"]) for e in events] == [
            ("ConfigWaitsForClaims", "Warning", 1),
            ("ConfigFullyApplied", "Normal", 1),
        ]
        assert "has taken full effect" in events[1]["message"]


async def test_a_second_edit_while_claims_wait_is_a_new_situation(short_dir: Path) -> None:
    async with dra_running(short_dir, by_capacity(4)) as run:
        await run.published(8)
        ref = run.claim("placed-at-4", SHARED)
        assert (await run.prepare(ref)).error == ""
        run.write(by_capacity(5))
        await once_old_shares(run, 1)
        run.write(by_capacity(8))  # the claim now waits for shares of 10240 MiB
        await wait_published(run.keeper, lambda _: old_shares(run)[0]["shareMiB"] == 10240)
        assert run.daemon.node_events is not None
        await run.daemon.node_events.flush()
        events = node_events(run)
        assert [e["reason"] for e in events] == ["ConfigWaitsForClaims"] * 2
        assert f"the config's share is {SHARE_AT_5} MiB" in events[0]["message"]
        assert "the config's share is 10240 MiB (8 per device)" in events[1]["message"]
        # Back to the claim's own share: nothing waits any more.
        run.write(by_capacity(4))
        await once_old_shares(run, 0)
        assert [e["reason"] for e in node_events(run)][-1] == "ConfigFullyApplied"


async def test_claims_count_at_the_memory_they_consumed(short_dir: Path) -> None:
    async with dra_running(short_dir, by_capacity(4)) as run:
        await run.published(8)
        one = run.claim("one-share", SHARED, selectors=[on_gpu(0)])
        two = run.claim("two-shares", SHARED, selectors=[on_gpu(0)], memory="40Gi")
        for ref in (one, two):
            assert (await run.prepare(ref)).error == ""
        results = {
            c["metadata"]["name"]: c["status"]["allocation"]["devices"]["results"][0]
            for c in run.api.dra_objects("resourceclaims")
        }
        assert results["one-share"]["device"] == results["two-shares"]["device"]
        assert results["one-share"]["consumedCapacity"] == {"memory": "20Gi"}
        assert results["two-shares"]["consumedCapacity"] == {"memory": "40Gi"}

        # 5 replicas, 16384 MiB a share: 40 GiB is no whole number of them, and a claim that
        # asks nothing gets 16 GiB now; the two hold 60 GiB of 80: one new share fits.
        run.write(by_capacity(5))
        (waiting,) = await once_old_shares(run, 1)
        assert (waiting["oldShareClaims"], waiting["heldMiB"], waiting["fitNow"]) == (2, 61440, 1)
        (event,) = node_events(run)
        assert (
            f"2 claim(s) hold the old share ({SHARE_AT_4} MiB), the config's share is "
            f"{SHARE_AT_5} MiB (5 per device), 1 new share(s) fit now"
        ) in event["message"]

        # 8 replicas, 10240 MiB a share: 40 GiB is four of them, what a claim asking 40 GiB
        # gets now; only the claim that asked nothing holds more than it would get.
        run.write(by_capacity(8))
        await wait_published(run.keeper, lambda _: old_shares(run)[0]["shareMiB"] == 10240)
        (waiting,) = old_shares(run)
        assert (waiting["oldShareClaims"], waiting["heldMiB"], waiting["fitNow"]) == (1, 61440, 2)
        assert await run.unprepare(one) == ""
        await once_old_shares(run, 0)
        assert [e["reason"] for e in node_events(run)] == [
            "ConfigWaitsForClaims",
            "ConfigWaitsForClaims",
            "ConfigFullyApplied",
        ]
        assert "1 claim(s) hold the old share (20480 MiB)" in node_events(run)[1]["message"]


async def test_a_checkpoint_of_an_earlier_version_counts_its_claims_at_their_placed_share(
    short_dir: Path,
) -> None:
    async with dra_running(short_dir, by_capacity(4)) as run:
        await run.published(8)
        for name in ("one-share", "two-shares"):
            memory = "40Gi" if name == "two-shares" else None
            ref = run.claim(name, SHARED, selectors=[on_gpu(0)], memory=memory)
            assert (await run.prepare(ref)).error == ""
    # The file as the version before consumed memory was recorded wrote it.
    path = checkpoint_path(short_dir, DRIVER)
    data = json.loads(path.read_text())
    for claim in data["claims"]:
        for device in claim["devices"]:
            assert device.pop("consumedMiB") in (20480, 40960)
            assert device.pop("askedMiB", 40960) == 40960
    canonical = json.dumps(data["claims"], sort_keys=True, separators=(",", ":"))
    data["checksum"] = hashlib.sha256(canonical.encode()).hexdigest()
    path.write_text(json.dumps(data))
    async with dra_running(short_dir, by_capacity(5)) as run:
        # Both loaded, each at the 20 GiB share it was placed at (what was known then).
        (waiting,) = await once_old_shares(run, 1)
        assert (waiting["oldShareClaims"], waiting["heldMiB"], waiting["fitNow"]) == (2, 40960, 2)
        assert not path.with_name(path.name + ".corrupt").exists()
