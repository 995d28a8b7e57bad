"""Declared MIG layouts through the real daemon: issue 8's "Done when", seen from kubelet's side.

The daemon runs in-process on a simulated node next to the kubelet simulator; the layout comes
from the config file and changes by editing it. Every test asserts on the simulator's own record
of MIG calls (what NVML was asked to do), on what kubelet is told, and on `/status`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from daemon_harness import Running, running
from support.observe import messages_received, next_applied, next_rejected

from sharing_plugin.cli import main
from sharing_plugin.daemon.node.outcome import Applied
from sharing_plugin.nvml.discover import discover
from sharing_plugin.sim.nvml.simulated import SimulatedNvml
from sharing_plugin.sources.update import Trigger

A100 = "simulated:a100-mig-mixed"
H200 = "simulated:hgx-h200"
# UUIDs are deterministic per preset, so the node seen before the daemon runs names its GPUs.
MIXED = discover(SimulatedNvml.from_preset("a100-mig-mixed"))
HGX = discover(SimulatedNvml.from_preset("hgx-h200"))

Call = tuple[str, int, str | None, int | None]


def layout(entries: str, *, sharing: str = "") -> str:
    """A config declaring `entries` (YAML list items under partitioning.mig), mixed strategy."""
    return f"version: v1\nflags:\n  migStrategy: mixed\n{sharing}partitioning:\n  mig:\n{entries}"


def calls(run: Running) -> list[Call]:
    """The MIG calls NVML received since the last look, all of which must have succeeded."""
    made = list(run.nvml.mig_calls)
    run.nvml.mig_calls.clear()
    assert all(c.result == "SUCCESS" for c in made), made
    return [(c.op, c.gpu, c.profile, c.start) for c in made]


def created(gpu: int, profile: str, start: int) -> list[Call]:
    return [
        ("create_gpu_instance", gpu, profile, start),
        ("create_compute_instance", gpu, profile, start),
    ]


def destroyed(gpu: int, profile: str, start: int) -> list[Call]:
    return [
        ("destroy_compute_instance", gpu, profile, start),
        ("destroy_gpu_instance", gpu, profile, start),
    ]


def capacity(run: Running) -> dict[str, int]:
    return {name: n for name, n in run.capacity().items() if n}


def mig_status(run: Running) -> dict[str, tuple[str, str | None]]:
    doc = run.daemon.status.to_json()["mig"]
    return {gpu: (s["state"], s["reason"]) for gpu, s in doc.items()}


async def until(run: Running, condition: Callable[[], bool], *, within: float = 5.0) -> None:
    """Wait through handled config updates (reloads, MIG retries) until `condition` holds."""
    with run.daemon.pipeline.outcomes() as outcomes:
        async with asyncio.timeout(within):
            while not condition():
                await outcomes.next()


async def reload(run: Running, text: str) -> None:
    """Edit the config file and wait until the daemon has handled the edit.

    Only where no MIG retry runs: the next handled update is then the edit's.
    """
    with run.daemon.pipeline.outcomes() as outcomes:
        run.write(text)
        await outcomes.next()


async def wait_capacity(run: Running, expected: dict[str, int]) -> None:
    """Once the daemon has handled a change: wait for kubelet to catch up with it.

    (Kubelet may see a new resource before the daemon records it as advertised, and nothing
    on kubelet's side changes after that; hence only after the daemon is done.)
    """
    await run.kubelet.wait_for(lambda: capacity(run) == expected, timeout=5)
    await run.settled()


# ---- declare -> create -> advertise ---------------------------------------------------------


async def test_declared_layout_is_created_and_advertised(short_dir: Path) -> None:
    config = layout(
        "    - devices: [3]\n      profiles: {3g.40gb: 1, 2g.20gb: 2}\n"  # MIG on, empty
        "    - devices: [5]\n      profiles: {2g.10gb: 3}\n"  # MIG off until now
    )
    async with running(short_dir, config, gpus=A100) as run:
        assert calls(run) == [
            *created(3, "2g.20gb", 0),
            *created(3, "2g.20gb", 2),
            *created(3, "3g.40gb", 4),
            ("set_mig_mode", 5, None, None),
            *created(5, "2g.10gb", 0),
            *created(5, "2g.10gb", 2),
            *created(5, "2g.10gb", 4),
        ]
        assert capacity(run) == {
            "nvidia.com/mig-1g.10gb": 9,
            "nvidia.com/mig-1g.5gb.me": 1,
            "nvidia.com/mig-2g.10gb": 1 + 3,
            "nvidia.com/mig-2g.20gb": 2 + 2,
            "nvidia.com/mig-3g.40gb": 2 + 1,
            "nvidia.com/mig-4g.20gb": 1,
        }  # GPU 5 is no longer a whole nvidia.com/gpu
        assert all(i.startswith("MIG-") for i in run.kubelet.devices("nvidia.com/mig-2g.10gb"))
        assert mig_status(run) == {
            MIXED.gpus[3].uuid: ("applied", None),
            MIXED.gpus[5].uuid: ("applied", None),
        }


async def test_h200_layout_is_created_and_advertised(short_dir: Path) -> None:
    config = layout("    - devices: [0, 1]\n      profiles: {3g.71gb: 1, 2g.35gb: 2}\n")
    async with running(short_dir, config, gpus=H200) as run:
        assert calls(run) == [
            call
            for gpu in (0, 1)
            for call in [
                ("set_mig_mode", gpu, None, None),
                *created(gpu, "2g.35gb", 0),
                *created(gpu, "2g.35gb", 2),
                *created(gpu, "3g.71gb", 4),
            ]
        ]
        assert capacity(run) == {
            "nvidia.com/gpu": 6,
            "nvidia.com/mig-2g.35gb": 4,
            "nvidia.com/mig-3g.71gb": 2,
        }
        assert set(mig_status(run).values()) == {("applied", None)}


# ---- change by reload: only what differs -----------------------------------------------------

A100_AS_IS = "    - devices: [0]\n      profiles: {3g.40gb: 1, 2g.20gb: 1, 1g.10gb: 1}\n"


async def test_reload_touches_only_the_differing_instances(short_dir: Path) -> None:
    async with running(short_dir, layout(A100_AS_IS), gpus=A100) as run:
        assert calls(run) == []  # GPU 0 already has that layout
        assert mig_status(run) == {MIXED.gpus[0].uuid: ("applied", None)}
        kept = set(run.kubelet.devices("nvidia.com/mig-3g.40gb"))
        before = capacity(run)

        await reload(run, layout("    - devices: [0]\n      profiles: {3g.40gb: 1, 1g.10gb: 3}\n"))
        await wait_capacity(
            run,
            {
                **before,
                "nvidia.com/mig-2g.20gb": before["nvidia.com/mig-2g.20gb"] - 1,
                "nvidia.com/mig-1g.10gb": before["nvidia.com/mig-1g.10gb"] + 2,
            },
        )
        assert calls(run) == [
            *destroyed(0, "2g.20gb", 4),
            *created(0, "1g.10gb", 4),
            *created(0, "1g.10gb", 5),
        ]
        assert set(run.kubelet.devices("nvidia.com/mig-3g.40gb")) == kept
        assert mig_status(run) == {MIXED.gpus[0].uuid: ("applied", None)}
        assert run.daemon.status.to_json()["config"]["generation"] == 2


async def test_h200_reload_keeps_the_slices_it_can(short_dir: Path) -> None:
    async with running(
        short_dir, layout("    - devices: [0]\n      profiles: {1g.18gb: 7}\n"), gpus=H200
    ) as run:
        calls(run)
        assert capacity(run) == {"nvidia.com/gpu": 7, "nvidia.com/mig-1g.18gb": 7}
        seven = set(run.kubelet.devices("nvidia.com/mig-1g.18gb"))

        await reload(run, layout("    - devices: [0]\n      profiles: {3g.71gb: 1, 1g.18gb: 4}\n"))
        await wait_capacity(
            run,
            {"nvidia.com/gpu": 7, "nvidia.com/mig-1g.18gb": 4, "nvidia.com/mig-3g.71gb": 1},
        )
        assert calls(run) == [
            *destroyed(0, "1g.18gb", 4),
            *destroyed(0, "1g.18gb", 5),
            *destroyed(0, "1g.18gb", 6),
            *created(0, "3g.71gb", 4),
        ]
        assert set(run.kubelet.devices("nvidia.com/mig-1g.18gb")) < seven  # slices 0-3 kept
        assert mig_status(run) == {HGX.gpus[0].uuid: ("applied", None)}


# ---- a held instance blocks its destroy until the pod is deleted ----------------------------


async def test_held_instance_blocks_its_gpu_until_the_pod_is_deleted(short_dir: Path) -> None:
    async with running(short_dir, layout(A100_AS_IS), gpus=A100) as run:
        pod = await run.kubelet.admit_pod(
            "trainer", containers={"main": {"nvidia.com/mig-3g.40gb": 1}}
        )
        (held,) = pod.device_ids("main", "nvidia.com/mig-3g.40gb")
        busy = next(g for g in MIXED.gpus if held in {m.uuid for m in g.mig_devices})
        free = next(g for g in MIXED.gpus[:2] if g is not busy)
        before = capacity(run)

        # Seven 1g.10gb need the 3g.40gb's slices on both GPUs: the free one goes ahead.
        await reload(run, layout("    - devices: [0, 1]\n      profiles: {1g.10gb: 7}\n"))
        assert mig_status(run)[free.uuid] == ("applied", None)
        state, reason = mig_status(run)[busy.uuid]
        assert state == "pending"
        assert reason is not None and reason.startswith(
            f"waiting for pod default/trainer to release {held}"
        )
        made = calls(run)
        assert {c[1] for c in made} == {free.index}  # the busy GPU is left as it is
        assert [c for c in made if c[0] == "destroy_gpu_instance"] == [
            ("destroy_gpu_instance", free.index, "3g.40gb", 0),
            ("destroy_gpu_instance", free.index, "2g.20gb", 4),
        ]
        await wait_capacity(
            run,
            {
                **before,
                "nvidia.com/mig-3g.40gb": 1,
                "nvidia.com/mig-2g.20gb": 1,
                "nvidia.com/mig-1g.10gb": before["nvidia.com/mig-1g.10gb"] + 6,
            },
        )
        assert held in run.kubelet.devices("nvidia.com/mig-3g.40gb")

        run.kubelet.delete_pod("trainer")
        await until(run, lambda: mig_status(run).get(busy.uuid) == ("applied", None))
        made = calls(run)
        assert {c[1] for c in made} == {busy.index}
        assert [c[0] for c in made].count("create_gpu_instance") == 6  # 1g.10gb@6 is kept
        await wait_capacity(
            run,
            {
                **{
                    k: v
                    for k, v in before.items()
                    if k not in ("nvidia.com/mig-3g.40gb", "nvidia.com/mig-2g.20gb")
                },
                "nvidia.com/mig-1g.10gb": before["nvidia.com/mig-1g.10gb"] + 12,
            },
        )


# ---- an impossible layout by reload changes nothing ------------------------------------------

IMPOSSIBLE = layout(
    "    - devices: [3]\n      profiles: {3g.40gb: 2}\n"  # a change that alone would be fine
    "    - devices: [4]\n"
    "      profiles: {4g.20gb: 1, 2g.10gb: 2}\n"
)


async def test_impossible_layout_by_reload_is_rejected_and_touches_nothing(
    short_dir: Path,
) -> None:
    start = layout("    - devices: [3]\n      profiles: {7g.80gb: 1}\n")
    async with running(short_dir, start, gpus=A100) as run:
        assert calls(run) == created(3, "7g.80gb", 0)
        before = capacity(run)
        messages = {r: messages_received(run.kubelet, r) for r in run.kubelet.resources()}

        with run.daemon.pipeline.outcomes() as outcomes:
            run.write(IMPOSSIBLE)
            await next_rejected(outcomes)
        status = run.daemon.status.to_json()
        assert status["lastError"] == (
            f"{run.config}:9:7: partitioning.mig[1].profiles: GPU 4 ({MIXED.gpus[4].uuid}): "
            "4g.20gb + 2 x 2g.10gb needs 8 slices in an arrangement the A100-40GB does not "
            "allow: 4g.20gb may start only at 0; 2g.10gb may start only at 0, 2 or 4"
        )
        assert calls(run) == []  # not even GPU 3's possible part
        assert status["config"]["generation"] == 1
        assert mig_status(run) == {MIXED.gpus[3].uuid: ("applied", None)}
        assert capacity(run) == before
        assert {r: messages_received(run.kubelet, r) for r in run.kubelet.resources()} == messages
        assert 'sharing_plugin_reloads_total{result="failed"} 1.0' in (
            run.daemon.metrics.render().decode()
        )


def test_impossible_layout_is_valid_syntax_for_validate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`validate` checks the config alone; only a node tells that a layout cannot fit, and
    `plan` on that node rejects it with the same line the daemon shows (tested with the plan
    command's other MIG cases)."""
    config = tmp_path / "impossible.yaml"
    config.write_text(IMPOSSIBLE)
    assert main(["validate", str(config)]) == 0
    assert main(["plan", "--config", str(config), "--gpus", A100]) == 1
    out = capsys.readouterr().out
    assert f"{config}:9:7: partitioning.mig[1].profiles: GPU 4 " in out


# ---- time-slicing on top of a declared layout ------------------------------------------------


def sliced_mig(replicas: int) -> str:
    return layout(
        "    - devices: [0]\n      profiles: {1g.18gb: 7}\n",
        sharing=(
            "sharing:\n  timeSlicing:\n    resources:\n"
            f"      - name: nvidia.com/mig-1g.18gb\n        replicas: {replicas}\n"
        ),
    )


async def test_time_slicing_on_a_declared_h200_layout(short_dir: Path) -> None:
    async with running(short_dir, sliced_mig(2), gpus=H200) as run:
        assert len(calls(run)) == 1 + 7 * 2  # MIG on, seven GPU + compute instances
        assert capacity(run) == {"nvidia.com/gpu": 7, "nvidia.com/mig-1g.18gb": 14}
        ids = set(run.kubelet.devices("nvidia.com/mig-1g.18gb"))
        assert {i.rsplit("::", 1)[1] for i in ids} == {"0", "1"}
        pod = await run.kubelet.admit_pod("infer", containers={"c": {"nvidia.com/mig-1g.18gb": 2}})
        given = pod.get("c", "nvidia.com/mig-1g.18gb")
        visible = given.response.envs["NVIDIA_VISIBLE_DEVICES"].split(",")
        assert visible == list(dict.fromkeys(i.split("::")[0] for i in given.device_ids))
        assert all(v.startswith("MIG-") for v in visible)

        await reload(run, sliced_mig(4))  # more replicas: a sharing change, nothing for NVML to do
        await wait_capacity(run, {"nvidia.com/gpu": 7, "nvidia.com/mig-1g.18gb": 28})
        assert ids < set(run.kubelet.devices("nvidia.com/mig-1g.18gb"))
        assert calls(run) == []
        assert mig_status(run) == {HGX.gpus[0].uuid: ("applied", None)}


# ---- without partitioning, MIG is never touched ----------------------------------------------


@pytest.mark.parametrize("gpus", [A100, H200])
async def test_without_partitioning_mig_is_never_touched(short_dir: Path, gpus: str) -> None:
    mixed = "version: v1\nflags:\n  migStrategy: mixed\n"
    async with running(short_dir, mixed, gpus=gpus) as run:
        before = capacity(run)
        with run.daemon.pipeline.outcomes() as outcomes:
            run.write(
                mixed + "sharing:\n  timeSlicing:\n    resources:\n"
                "      - name: nvidia.com/gpu\n        replicas: 2\n"
            )
            await next_applied(outcomes)
        await run.settled()
        assert capacity(run) != before  # the reload was applied
        assert run.nvml.mig_calls == []
        assert run.daemon.status.to_json()["mig"] == {}


# ---- a pending layout is the last good config's, whatever the file says meanwhile -----------


def reloads(run: Running, result: str) -> str:
    metrics = run.daemon.metrics.render().decode()
    line = next(li for li in metrics.splitlines() if f'reloads_total{{result="{result}"}}' in li)
    return line.rsplit(" ", 1)[1]


async def test_broken_edit_while_pending_keeps_the_pending_layout_going(
    short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    seven = layout("    - devices: [0]\n      profiles: {1g.10gb: 7}\n")
    async with running(short_dir, layout(A100_AS_IS), gpus=A100) as run:
        await run.kubelet.admit_pod("trainer", containers={"main": {"nvidia.com/mig-3g.40gb": 2}})
        await reload(run, seven)
        await until(run, lambda: mig_status(run)[MIXED.gpus[0].uuid][0] == "pending")
        run.write(IMPOSSIBLE)
        await until(run, lambda: run.daemon.status.last_error is not None)
        error = run.daemon.status.last_error
        with run.daemon.pipeline.outcomes() as outcomes:
            for _ in range(3):  # retries while the layout waits for the pod
                retried = await outcomes.next()
                assert isinstance(retried, Applied) and retried.trigger is Trigger.MIG_RETRY
        assert (reloads(run, "ok"), reloads(run, "failed")) == ("2.0", "1.0")
        said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert sum("MIG layout pending: waiting for pod" in m for m in said) == 1
        assert sum("config rejected" in m for m in said) == 1

        run.kubelet.delete_pod("trainer")
        await until(run, lambda: mig_status(run)[MIXED.gpus[0].uuid] == ("applied", None))
        made = calls(run)
        assert {c[1] for c in made} == {0}
        assert [c for c in made if c[0] == "destroy_gpu_instance"] == [
            ("destroy_gpu_instance", 0, "3g.40gb", 0),
            ("destroy_gpu_instance", 0, "2g.20gb", 4),
        ]
        status = run.daemon.status.to_json()
        assert status["lastError"] == error  # the file on disk is still the broken one
        assert status["config"]["generation"] == 2
        assert (reloads(run, "ok"), reloads(run, "failed")) == ("2.0", "1.0")


async def test_held_replica_of_a_time_sliced_instance_blocks_it_too(short_dir: Path) -> None:
    async with running(short_dir, sliced_mig(2), gpus=H200) as run:
        calls(run)
        pod = await run.kubelet.admit_pod("infer", containers={"c": {"nvidia.com/mig-1g.18gb": 1}})
        (replica,) = pod.device_ids("c", "nvidia.com/mig-1g.18gb")
        whole = layout("    - devices: [0]\n      profiles: {7g.141gb: 1}\n")

        await reload(run, whole)
        await until(run, lambda: mig_status(run)[HGX.gpus[0].uuid][0] == "pending")
        reason = mig_status(run)[HGX.gpus[0].uuid][1] or ""
        mig = replica.split("::")[0]  # the instance is what waits, whichever replica is held
        assert reason.startswith(f"waiting for pod default/infer to release {mig}, ")
        assert calls(run) == []

        run.kubelet.delete_pod("infer")
        await until(run, lambda: mig_status(run)[HGX.gpus[0].uuid] == ("applied", None))
        assert calls(run) == [
            *(c for start in range(7) for c in destroyed(0, "1g.18gb", start)),
            *created(0, "7g.141gb", 0),
        ]
        await wait_capacity(run, {"nvidia.com/gpu": 7, "nvidia.com/mig-7g.141gb": 1})


async def test_removing_partitioning_leaves_the_layout_and_clears_its_status(
    short_dir: Path,
) -> None:
    start = layout("    - devices: [3]\n      profiles: {7g.80gb: 1}\n")
    async with running(short_dir, start, gpus=A100) as run:
        calls(run)
        before = capacity(run)
        await reload(run, "version: v1\nflags:\n  migStrategy: mixed\n")
        assert mig_status(run) == {}
        await run.settled()
        assert calls(run) == [] and capacity(run) == before


async def test_impossible_layout_at_start_advertises_nothing_until_fixed(short_dir: Path) -> None:
    async with running(short_dir, IMPOSSIBLE, gpus=A100, wait_ready=False) as run:
        error = run.daemon.status.last_error or ""
        assert "partitioning.mig[1].profiles: GPU 4" in error and "does not allow" in error
        assert calls(run) == [] and capacity(run) == {}
        await reload(run, layout("    - devices: [3]\n      profiles: {7g.80gb: 1}\n"))
        await run.settled()
        assert calls(run) == created(3, "7g.80gb", 0)
        assert run.daemon.status.last_error is None


async def test_a_config_whose_sharing_does_not_fit_touches_no_mig_instance(
    short_dir: Path,
) -> None:
    """The layout alone fits, but the config's sharing names a MIG device (GPU 0's third) that
    the new layout will not have: rejected before any instance is created or destroyed."""
    start = layout("    - devices: [0]\n      profiles: {1g.18gb: 7}\n")
    async with running(short_dir, start, gpus=H200) as run:
        calls(run)
        before = capacity(run)
        misfit = layout(
            "    - devices: [0]\n      profiles: {3g.71gb: 2}\n",
            sharing=(
                "sharing:\n  timeSlicing:\n    resources:\n"
                "      - name: nvidia.com/mig-3g.71gb\n        devices: ['0:2']\n"
                "        replicas: 2\n"
            ),
        )
        await reload(run, misfit)
        error = run.daemon.status.to_json()["lastError"]
        assert error is not None and "sharing.timeSlicing.resources[0].devices[0]" in error
        assert calls(run) == []
        assert capacity(run) == before
        # The same sharing on a MIG device the new layout does have is applied in full.
        await reload(run, misfit.replace("'0:2'", "'0:1'"))
        assert run.daemon.status.to_json()["lastError"] is None
        assert len(calls(run)) == 7 * 2 + 2 * 2
        await wait_capacity(run, {"nvidia.com/gpu": 7, "nvidia.com/mig-3g.71gb": 3})


DYNAMIC = layout(
    "    - devices: [4]\n      profiles: {7g.40gb: 1}\n    - devices: [5]\n      dynamic: true\n"
)


async def test_run_refuses_a_dynamic_entry_naming_run_dra_and_touches_nothing(
    short_dir: Path,
) -> None:
    """`run` cannot make an instance per claim: the edit is rejected at the entry's line,
    before anything is touched (GPU 5's MIG mode stays off, GPU 4 keeps its instances)."""
    start = layout("    - devices: [3]\n      profiles: {7g.80gb: 1}\n")
    async with running(short_dir, start, gpus=A100) as run:
        assert calls(run) == created(3, "7g.80gb", 0)
        before = capacity(run)
        with run.daemon.pipeline.outcomes() as outcomes:
            run.write(DYNAMIC)
            rejected = await next_rejected(outcomes)
        assert [str(p) for p in rejected.problems] == [
            f"{run.config}:9:7: partitioning.mig[1].dynamic: dynamic MIG is served by "
            "sharing-plugin run-dra only (instances created per claim); the device plugin "
            "(run) serves fixed layouts: run run-dra on this node, or remove dynamic and "
            "declare profiles"
        ]
        assert run.daemon.status.to_json()["lastError"] == str(rejected.problems[0])
        assert calls(run) == []
        assert capacity(run) == before
