"""The MPS control binary as a process: the tests' stand-in for `nvidia-cuda-mps-control`, and
the adapter (`ControlBinary`, `wait_exit`) driving it as it drives the real one."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from mps_harness import ask, reap_daemons
from support.mps import alive, pid_of, write_wrapper

from sharing_plugin.errors import MpsError
from sharing_plugin.mps import ControlBinary, process_alive, wait_exit

pytestmark = pytest.mark.subprocess


@pytest.fixture
def binary(short_dir: Path) -> Iterator[Path]:
    yield write_wrapper(short_dir / "bin")
    reap_daemons(short_dir)


def start(binary: Path, pipe: Path, log: Path, devices: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
        "CUDA_MPS_LOG_DIRECTORY": str(log),
        "CUDA_VISIBLE_DEVICES": devices,
    }
    return subprocess.run(
        [str(binary), "-d"], env=env, capture_output=True, text=True, timeout=10, check=False
    )


def test_daemon_holds_and_reports_limits_and_quits(binary: Path, short_dir: Path) -> None:
    pipe, log = short_dir / "pipe", short_dir / "log"
    assert start(binary, pipe, log, "GPU-a,GPU-b").returncode == 0
    pid = pid_of(pipe)
    assert pid is not None and alive(pid)

    again = start(binary, pipe, log, "GPU-a")
    assert again.returncode == 1
    assert "already running" in again.stderr

    done = ask(
        binary,
        pipe,
        [
            "set_default_active_thread_percentage 25",
            "set_default_device_pinned_mem_limit 1 20480M",
            "get_default_active_thread_percentage",
            "get_default_device_pinned_mem_limit 1",
            "get_default_device_pinned_mem_limit 0",
            "get_server_list",
        ],
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["25.0", "25.0", "20480M", "none"]

    refused = ask(binary, pipe, ["set_default_device_pinned_mem_limit 2 1M", "bogus"])
    assert refused.returncode == 1
    assert "invalid device '2'" in refused.stderr
    assert "Unrecognized command: bogus" in refused.stderr

    assert ask(binary, pipe, ["quit"]).returncode == 0
    # As with NVIDIA's, `quit` is answered at once and the daemon exits after it: its pid file
    # goes then (a moment later on a loaded machine).
    deadline = time.monotonic() + 10.0
    while (pipe / "nvidia-cuda-mps-control.pid").exists():
        assert time.monotonic() < deadline, "the pid file stayed 10 s after quit"
        time.sleep(0.02)
    assert "Startup, 2 device(s)" in (log / "control.log").read_text()

    gone = ask(binary, pipe, ["get_server_list"])
    assert gone.returncode == 1
    assert "Cannot find MPS control daemon process" in gone.stderr


async def test_adapter_starts_sends_and_sees_a_crash_at_once(binary: Path, short_dir: Path) -> None:
    control = ControlBinary(str(binary))
    pipe = short_dir / "p"
    await control.start_daemon(pipe_directory=pipe, log_directory=short_dir / "l", devices=["G"])
    pid = control.daemon_pid(pipe)
    assert pid is not None and process_alive(pid)
    out = await control.send(pipe, ["set_default_active_thread_percentage 50"])
    assert out.split() == ["50.0"]

    with pytest.raises(MpsError, match="already running"):
        await control.start_daemon(pipe_directory=pipe, log_directory=short_dir / "l", devices=[])

    await control.send(pipe, ["sim_die"])  # a crash: no cleanup, the pid file stays
    await wait_exit(pid)
    assert not process_alive(pid)
    assert control.daemon_pid(pipe) == pid
    with pytest.raises(MpsError, match="Cannot find MPS control daemon"):
        await control.send(pipe, ["get_server_list"])

    # A stale pid file does not stop the next start.
    await control.start_daemon(pipe_directory=pipe, log_directory=short_dir / "l", devices=["G"])
    second = control.daemon_pid(pipe)
    assert second is not None and second != pid
    os.kill(second, signal.SIGKILL)
    await wait_exit(second)


async def test_missing_binary_is_an_mps_error(short_dir: Path) -> None:
    control = ControlBinary(str(short_dir / "nope"))
    with pytest.raises(MpsError, match="--mps-control-bin"):
        await control.start_daemon(pipe_directory=short_dir, log_directory=short_dir, devices=[])
