"""`sharing.mps.multiUser`: daemons started with `-M`, directories every UID reaches, and the
stand-in daemon refusing or serving a client of another UID as MPS does."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from mps_harness import (
    ask,
    controller,
    eventually_record,
    mps_config,
    pipe_of,
    resource_root,
    write,
)
from support.mps import NOBODY, client_as, interpreter_for_others
from support.observe import next_applied

from sharing_plugin.mps import DaemonState

MULTI_USER = "    multiUser: true\n"

pytestmark = pytest.mark.subprocess  # the stand-in MPS control daemon runs as a process


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_multi_user_starts_the_daemon_with_M_and_a_toggle_restarts_it(
    short_dir: Path, binary: Path, gpus: str
) -> None:
    mps_root = short_dir / "mps"
    config = short_dir / "config.yaml"
    config.write_text(mps_config(mps_root, replicas=2) + MULTI_USER)
    log = resource_root(mps_root) / "log" / "control.log"
    async with controller(config, binary, gpus=gpus) as running:
        first = await eventually_record(mps_root, lambda r: r.state is DaemonState.READY)
        assert log.read_text().count("Startup, 2 device(s), multi-user") == 1
        # Every UID reaches the pipes and the shared memory; none removes another's files.
        assert mode(pipe_of(mps_root)) == 0o1777
        assert mode(resource_root(mps_root) / "log") == 0o1777
        assert mode(mps_root / "shm") == 0o1777
        assert mode(resource_root(mps_root)) & 0o005 == 0o005

        with running.pipeline.outcomes() as outcomes:
            write(config, mps_config(mps_root, replicas=2))  # multiUser off: -M is a start flag
            await next_applied(outcomes)
        second = await eventually_record(
            mps_root, lambda r: r.state is DaemonState.READY and r.pid != first.pid
        )
        assert second.fingerprint != first.fingerprint
        assert second.limits == first.limits  # only the mode changed
        starts = [line for line in log.read_text().splitlines() if "Startup" in line]
        assert starts[-1].endswith("Startup, 2 device(s)")
        assert mode(pipe_of(mps_root)) == 0o755  # closed again
        assert mode(resource_root(mps_root) / "log") == 0o755

        with running.pipeline.outcomes() as outcomes:
            write(config, mps_config(mps_root, replicas=2) + MULTI_USER)
            await next_applied(outcomes)
        third = await eventually_record(
            mps_root, lambda r: r.state is DaemonState.READY and r.pid != second.pid
        )
        assert third.fingerprint == first.fingerprint
        assert log.read_text().count("multi-user") == 2


@pytest.mark.skipif(os.geteuid() != 0, reason="running a client as another UID needs root")
async def test_a_client_of_another_uid_is_refused_without_M_and_served_with_it(
    short_dir: Path, binary: Path, gpus: str
) -> None:
    python = interpreter_for_others()
    if python is None:
        pytest.skip("no Python interpreter another UID may run")
    os.chmod(short_dir, 0o755)  # as /run is: the directories above mpsRoot are the node's
    mps_root = short_dir / "mps"
    config = short_dir / "config.yaml"
    config.write_text(mps_config(mps_root, replicas=2))
    pipe = pipe_of(mps_root)
    async with controller(config, binary, gpus=gpus) as running:
        first = await eventually_record(mps_root, lambda r: r.state is DaemonState.READY)
        own = ask(binary, pipe, ["sim_client"])  # root's client: the server runs for UID 0
        assert own.returncode == 0, own.stderr
        # The socket is reachable (the pipe directory is searchable): the daemon says no.
        refused = client_as(NOBODY, pipe, python=python)
        assert refused.returncode == 1
        assert f"Client of UID {NOBODY} refused: the MPS server runs for UID 0" in refused.stderr
        assert "-M" in refused.stderr

        with running.pipeline.outcomes() as outcomes:
            write(config, mps_config(mps_root, replicas=2) + MULTI_USER)
            await next_applied(outcomes)
        await eventually_record(
            mps_root, lambda r: r.state is DaemonState.READY and r.pid != first.pid
        )
        assert ask(binary, pipe, ["sim_client"]).returncode == 0
        served = client_as(NOBODY, pipe, python=python)
        assert served.returncode == 0, served.stderr
        assert f"Client of UID {NOBODY} served by the multi-user server" in served.stdout
