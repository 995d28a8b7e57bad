"""run-dra in-process, `dra.sharedDevices: capacity`: a replicas edit while claims hold the old
share waits for them, and the Node hears it once per change of that situation (Events through
the fake API server, as `run`'s are filed), besides `/status` `dra.oldShares`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dra_harness import NODE, DraRun, dra_running
from support.observe import wait_published

SHARED = "nvidia.com/gpu.shared"
SHARE_AT_4, SHARE_AT_5 = 20480, 16384  # MiB of an 80 GiB A100 at 4 and 5 replicas


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
        first, second = run.claim("first", SHARED), run.claim("second", SHARED)
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
