"""A stand-in for `nvidia-cuda-mps-control`, run as a real process by the tests.

The MPS control daemon is an outside program the plugin drives through its command line: `-d`
starts it in the background for the GPUs in `CUDA_VISIBLE_DEVICES`, with its pipes in
`CUDA_MPS_PIPE_DIRECTORY` and its logs in `CUDA_MPS_LOG_DIRECTORY`; without `-d` the command
reads control commands from stdin and sends each to the daemon of that pipe directory. This
package implements that surface as a separate executable (the script `control.py`, run through
the wrapper `write_wrapper` makes for `--mps-control-bin`), so the production adapter that
spawns the binary is what the tests exercise, down to processes that die.

It lives with the tests, not in the package: a real node runs NVIDIA's binary, and the wheel
carries only what a node runs.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from support.mps.control import CONTROL_SOCKET, PID_FILE

__all__ = [
    "CONTROL_SOCKET",
    "NOBODY",
    "PID_FILE",
    "alive",
    "client_as",
    "interpreter_for_others",
    "pid_of",
    "write_wrapper",
]

WRAPPER_NAME = "nvidia-cuda-mps-control"
NOBODY = 65534
_SCRIPT = Path(__file__).resolve().parent / "control.py"


def write_wrapper(directory: Path, *, python: str = sys.executable) -> Path:
    """An executable `directory/nvidia-cuda-mps-control` that runs the stand-in.

    The script is run by its path: it imports only the standard library, so it needs neither
    the tests' import path nor the package.
    """
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / WRAPPER_NAME
    script = Path(__file__).resolve().parent / "control.py"
    path.write_text(
        f'#!/bin/sh\nexec {_quote(python)} {_quote(str(script))} "$@"\n', encoding="utf-8"
    )
    path.chmod(0o755)
    return path


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def pid_of(pipe_directory: Path) -> int | None:
    """The pid the simulated daemon of `pipe_directory` wrote, if any (for tests)."""
    try:
        return int((pipe_directory / PID_FILE).read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return None


def alive(pid: int) -> bool:
    """Whether `pid` runs and is not a zombie (for tests)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def interpreter_for_others() -> str | None:
    """A Python another UID may run (every directory above it searchable), or None.

    A virtual environment under root's home is not; the system's interpreter usually is.
    """
    for candidate in (sys.executable, "/usr/bin/python3"):
        real = Path(candidate).resolve()
        if real.is_file() and all(_others_may(p, stat.S_IXOTH) for p in (real, *real.parents)):
            return str(real)
    return None


def _others_may(path: Path, bit: int) -> bool:
    try:
        return bool(path.stat().st_mode & bit)
    except OSError:
        return False


def client_as(uid: int, pipe: Path, *, python: str) -> subprocess.CompletedProcess[str]:
    """A CUDA client of `uid` connecting to the daemon of `pipe` (the stand-in's `sim_client`),
    as a process of that user: the daemon sees its UID on the socket. Needs root."""
    return subprocess.run(
        [python, str(_SCRIPT)],
        input="sim_client\n",
        capture_output=True,
        text=True,
        env={"CUDA_MPS_PIPE_DIRECTORY": str(pipe), "PATH": os.environ.get("PATH", "")},
        user=uid,
        group=uid,
        extra_groups=[],
        cwd="/",
        timeout=10,
        check=False,
    )
