"""The simulated MPS control program: `-d` starts a daemon, otherwise stdin commands go to it.

What the real `nvidia-cuda-mps-control` does and the plugin relies on, kept: `-d` returns once
a daemon runs in the background (double fork, new session, its pid in the pipe directory), and
fails while another one serves the same pipe directory; the commands `get_server_list`,
`get_default_active_thread_percentage`, `set_default_active_thread_percentage <pct>`,
`get_default_device_pinned_mem_limit <dev>`, `set_default_device_pinned_mem_limit <dev>
<value>` and `quit`, one per stdin line, each answered on stdout; devices are the ordinals of
`CUDA_VISIBLE_DEVICES` as the daemon saw it at start. Without a daemon the command exits 1 with
the real one's message. Added for tests: `sim_die` makes the daemon exit at once without
cleaning up, as a crash would (SIGKILL of the pid does the same).

Users, as MPS has them: the daemon starts an MPS server for the UID of its first client and,
unless started with `-M` (`-d -M`, multi-user), serves no client of another UID while that
server runs; the real daemon queues such a client until the server is gone, the stand-in
refuses it at once (its server never exits), so a test sees the refusal without waiting. With
`-M` one server serves every UID. `sim_client` is what a CUDA application's connection does
(stand-in only): the daemon takes the client's UID from the socket (SO_PEERCRED), so a test
runs it as another user to be refused or served. The control socket is open to every UID, as
the real daemon's are: who may use the daemon is the daemon's decision, and whether a client
reaches the socket at all is the pipe directory's mode.

The daemon and its clients talk over a unix socket `control` in the pipe directory, one
connection per command: a status line (`ok` or `error`) then the answer.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import struct
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

PID_FILE = "nvidia-cuda-mps-control.pid"
CONTROL_SOCKET = "control"
LOG_FILE = "control.log"
NO_DAEMON = "Cannot find MPS control daemon process"
ALREADY_RUNNING = "An instance of this daemon is already running"
_LIMIT = re.compile(r"^[0-9]+[KMG]?$")
_TIMEOUT_S = 5.0


@dataclass(slots=True)
class _Limits:
    devices: int
    thread_percentage: float = 100.0
    pinned: dict[int, str] = field(default_factory=dict)
    multi_user: bool = False
    server_uid: int | None = None  # the UID the MPS server runs for, once a client came


def main(argv: Sequence[str], *, stdin: TextIO | None = None) -> int:
    env = os.environ
    pipe = Path(env.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))
    if sorted(argv) in (["-d"], ["-M", "-d"]):
        log = Path(env.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"))
        return _start(pipe, log, env, multi_user="-M" in argv)
    if argv:
        print(f"nvidia-cuda-mps-control: unknown arguments {' '.join(argv)}", file=sys.stderr)
        return 1
    return _client(pipe, stdin or sys.stdin)


# --- client ------------------------------------------------------------------------------------


def _client(pipe: Path, stdin: TextIO) -> int:
    status = 0
    for line in stdin:
        command = line.strip()
        if not command:
            continue
        try:
            ok, answer = _ask(pipe, command)
        except PermissionError as exc:
            print(f"{NO_DAEMON}: {pipe / CONTROL_SOCKET}: {exc.strerror}", file=sys.stderr)
            return 1
        except OSError:
            print(NO_DAEMON, file=sys.stderr)
            return 1
        if answer:
            print(answer, file=sys.stdout if ok else sys.stderr)
        status = status or (0 if ok else 1)
    return status


def _ask(pipe: Path, command: str) -> tuple[bool, str]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(_TIMEOUT_S)
        conn.connect(str(pipe / CONTROL_SOCKET))
        conn.sendall(command.encode() + b"\n")
        conn.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := conn.recv(4096):
            chunks.append(chunk)
    reply = b"".join(chunks).decode()
    if not reply:  # the daemon went away while answering (sim_die, quit)
        return True, ""
    status, _, answer = reply.partition("\n")
    return status == "ok", answer.rstrip("\n")


# --- daemon start ------------------------------------------------------------------------------


def _running_pid(pipe: Path) -> int | None:
    try:
        pid = int((pipe / PID_FILE).read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return None
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
            state = stat.read().rpartition(")")[2].split()[0]
    except OSError:
        return None
    return None if state == "Z" else pid


def _start(pipe: Path, log: Path, env: Mapping[str, str], *, multi_user: bool) -> int:
    if _running_pid(pipe) is not None:
        print(ALREADY_RUNNING, file=sys.stderr)
        return 1
    try:
        pipe.mkdir(parents=True, exist_ok=True)
        log.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"nvidia-cuda-mps-control: {exc}", file=sys.stderr)
        return 1
    visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "0").split(",") if d.strip()]
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover -- runs in the forked daemon
        os.close(read_end)
        os.setsid()
        if os.fork() != 0:
            os._exit(0)
        limits = _Limits(devices=len(visible), multi_user=multi_user)
        _daemon(pipe, log, limits, ready=write_end)
        os._exit(0)
    os.close(write_end)
    os.waitpid(child, 0)
    with os.fdopen(read_end, "rb") as ready:
        message = ready.read().decode()
    if message != "ok":
        print(message or "nvidia-cuda-mps-control: the daemon did not start", file=sys.stderr)
        return 1
    return 0


def _daemon(pipe: Path, log_dir: Path, limits: _Limits, *, ready: int) -> None:  # pragma: no cover
    """The background daemon: serve commands until `quit` or SIGTERM (runs in the fork)."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    log = (log_dir / LOG_FILE).open("a", encoding="utf-8", buffering=1)
    path = pipe / CONTROL_SOCKET
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        server.bind(str(path))
        path.chmod(0o777)
        server.listen(16)
        (pipe / PID_FILE).write_text(f"{os.getpid()}\n", encoding="utf-8")
    except OSError as exc:
        os.write(ready, f"nvidia-cuda-mps-control: {exc}".encode())
        os._exit(1)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    _log(log, f"Startup, {limits.devices} device(s){', multi-user' if limits.multi_user else ''}")
    os.write(ready, b"ok")
    os.close(ready)
    try:
        while True:
            conn, _ = server.accept()
            with conn:
                command = _receive(conn)
                _log(log, f"Command {command}")
                if command == "sim_die":
                    os._exit(1)
                if command == "sim_client":
                    ok, answer = _connect_client(_peer_uid(conn), limits)
                    _log(log, answer)
                else:
                    ok, answer = _execute(command, limits)
                with contextlib.suppress(OSError):
                    conn.sendall(f"{'ok' if ok else 'error'}\n{answer}".encode())
                if command == "quit":
                    break
    finally:
        _log(log, "Shutdown")
        server.close()
        for name in (CONTROL_SOCKET, PID_FILE):
            with contextlib.suppress(FileNotFoundError):
                (pipe / name).unlink()


def _receive(conn: socket.socket) -> str:  # pragma: no cover -- runs in the forked daemon
    conn.settimeout(_TIMEOUT_S)
    data = b""
    with contextlib.suppress(OSError):
        while chunk := conn.recv(4096):
            data += chunk
    return data.decode(errors="replace").strip()


def _peer_uid(conn: socket.socket) -> int:  # pragma: no cover -- runs in the forked daemon
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


def _connect_client(uid: int, limits: _Limits) -> tuple[bool, str]:
    """A CUDA client of `uid` asks for a server: served, or refused for another user's."""
    if limits.multi_user:
        return True, f"Client of UID {uid} served by the multi-user server"
    if limits.server_uid is None:
        limits.server_uid = uid
    if uid != limits.server_uid:
        return False, (
            f"Client of UID {uid} refused: the MPS server runs for UID {limits.server_uid} "
            "(start the control daemon with -M to serve several users)"
        )
    return True, f"Client of UID {uid} served by the server of UID {uid}"


def _log(log: TextIO, text: str) -> None:  # pragma: no cover -- runs in the forked daemon
    log.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {text}\n")


# --- commands ----------------------------------------------------------------------------------


def _execute(command: str, limits: _Limits) -> tuple[bool, str]:
    """(ok, answer) for one command line; `limits` is updated by the set commands."""
    words = command.split()
    if not words:
        return False, "empty command"
    name, args = words[0], words[1:]
    if name == "get_server_list" and not args:
        return True, ""  # no client has connected: no MPS server runs
    if name == "quit" and not args:
        return True, ""
    if name == "get_default_active_thread_percentage" and not args:
        return True, f"{limits.thread_percentage:.1f}"
    if name == "set_default_active_thread_percentage" and len(args) == 1:
        try:
            value = float(args[0])
        except ValueError:
            return False, f"invalid percentage {args[0]!r}"
        if not 0 < value <= 100:
            return False, f"percentage {args[0]} is outside (0, 100]"
        limits.thread_percentage = value
        return True, f"{value:.1f}"
    if name == "get_default_device_pinned_mem_limit" and len(args) == 1:
        device = _device(args[0], limits)
        if device is None:
            return False, f"invalid device {args[0]!r}"
        return True, limits.pinned.get(device, "none")
    if name == "set_default_device_pinned_mem_limit" and len(args) == 2:
        device = _device(args[0], limits)
        if device is None:
            return False, f"invalid device {args[0]!r}"
        if not _LIMIT.match(args[1]):
            return False, f"invalid memory limit {args[1]!r}"
        limits.pinned[device] = args[1]
        return True, ""
    return False, f"Unrecognized command: {command}"


def _device(text: str, limits: _Limits) -> int | None:
    if not text.isdigit() or int(text) >= limits.devices:
        return None
    return int(text)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
