"""The kit's pieces over real unix sockets: the path limit, the stale-socket probe, serving and
the answer check, and a lifecycle that closes what a failed start had started."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import grpc
import pytest

from sharing_plugin.errors import KubeletError
from sharing_plugin.kit import unix_grpc
from sharing_plugin.kit.lifecycle import Service
from sharing_plugin.kit.unix_grpc import SocketState
from sharing_plugin.kubelet.api.deviceplugin.v1beta1 import api_pb2 as dp
from sharing_plugin.kubelet.api.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from sharing_plugin.sim.kubelet.simulator import KubeletSimulator


class _Registration(dp_grpc.RegistrationServicer):
    async def Register(
        self, request: dp.RegisterRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> dp.Empty:
        return dp.Empty()


def _add_registration(server: grpc.aio.Server) -> None:
    dp_grpc.add_RegistrationServicer_to_server(_Registration(), server)


async def _register(channel: grpc.aio.Channel, *, within_s: float = 1.0) -> object:
    return await dp_grpc.RegistrationStub(channel).Register(
        dp.RegisterRequest(), timeout=within_s, wait_for_ready=True
    )


def _left_behind(path: Path) -> None:
    """A socket file a killed process leaves: bound once, nobody listening any more."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as bound:
        bound.bind(str(path))


def test_a_path_over_the_limit_is_refused_naming_size_limit_and_advice() -> None:
    fits = Path("/" + "k" * 106)
    unix_grpc.check_socket_path(fits, advice="unused")  # 107 bytes: the largest that fits
    over = Path("/" + "k" * 107)
    with pytest.raises(KubeletError) as raised:
        unix_grpc.check_socket_path(over, what="a test socket", advice="use a shorter dir")
    assert str(raised.value) == (
        f"socket path {over} (a test socket) is 108 bytes, over the 107-byte limit of a unix "
        "socket path: use a shorter dir"
    )


def test_the_kubelet_simulator_refuses_a_dir_too_long_for_its_sockets() -> None:
    kubelet_dir = Path("/" + "k" * 79)
    with pytest.raises(KubeletError) as raised:
        KubeletSimulator(kubelet_dir)
    socket_path = kubelet_dir / "device-plugins" / "kubelet.sock"
    assert str(raised.value) == (
        f"socket path {socket_path} is 108 bytes, over the 107-byte limit of a unix socket "
        "path: use a shorter kubelet dir"
    )


def test_the_probe_tells_missing_not_a_socket_stale_and_live(short_dir: Path) -> None:
    assert unix_grpc.probe(short_dir / "none.sock") is SocketState.MISSING
    (short_dir / "file.sock").write_text("")
    assert unix_grpc.probe(short_dir / "file.sock") is SocketState.NOT_A_SOCKET
    _left_behind(short_dir / "stale.sock")
    assert unix_grpc.probe(short_dir / "stale.sock") is SocketState.STALE
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listening:
        listening.bind(str(short_dir / "live.sock"))
        listening.listen()
        assert unix_grpc.probe(short_dir / "live.sock") is SocketState.LIVE
    assert unix_grpc.probe(short_dir / "live.sock") is SocketState.STALE  # its owner went


async def test_a_stale_socket_is_replaced_by_a_server_that_answers(short_dir: Path) -> None:
    path = short_dir / "plugin.sock"
    _left_behind(path)
    server = await unix_grpc.serve(path, _add_registration)
    try:
        assert unix_grpc.probe(path) is SocketState.LIVE
        await unix_grpc.check_answers(path, _register, who="the test plugin")
    finally:
        await server.stop(None)


async def test_a_socket_that_does_not_answer_fails_the_check_naming_who(short_dir: Path) -> None:
    path = short_dir / "silent.sock"
    _left_behind(path)
    with pytest.raises(KubeletError) as raised:
        await unix_grpc.check_answers(
            path, lambda channel: _register(channel, within_s=0.2), who="the test plugin"
        )
    assert str(raised.value).startswith(
        f"the test plugin does not answer on its own socket {path}: "
    )


async def test_a_socket_that_cannot_be_bound_names_who_and_advice(short_dir: Path) -> None:
    path = short_dir / "missing" / "plugin.sock"
    with pytest.raises(KubeletError) as raised:
        await unix_grpc.serve(path, _add_registration, who="gpu", advice="create the directory")
    message = str(raised.value)
    assert message.startswith(f"cannot listen for gpu on {path}: ")
    assert message.endswith("; create the directory")


class _TwoServers(Service):
    """Serves two sockets, the second of which may be impossible to bind."""

    def __init__(self, first: Path, second: Path) -> None:
        self.paths = (first, second)
        self.servers: list[grpc.aio.Server] = []
        self.closed = 0

    async def start(self) -> None:
        for path in self.paths:
            self.servers.append(await unix_grpc.serve(path, _add_registration))

    async def close(self) -> None:
        self.closed += 1
        servers, self.servers = self.servers, []
        for server in servers:
            await server.stop(None)
            # grpc leaves the socket file; its owner removes it, as on a clean close.
        for path in self.paths:
            if unix_grpc.probe(path) is SocketState.STALE:
                path.unlink()


async def test_a_failed_start_closes_what_it_had_started(short_dir: Path) -> None:
    service = _TwoServers(short_dir / "a.sock", short_dir / "missing" / "b.sock")
    with pytest.raises(KubeletError):
        async with service:
            pytest.fail("a start that failed must not enter")
    assert service.closed == 1
    assert service.servers == []
    assert unix_grpc.probe(short_dir / "a.sock") is SocketState.MISSING


async def test_the_kubelet_simulator_closes_its_first_socket_when_the_second_fails(
    short_dir: Path,
) -> None:
    # Something in the way of the registration socket, which a starting kubelet does not
    # clean (it keeps directories): PodResources was served first, and must not stay served.
    (short_dir / "device-plugins" / "kubelet.sock").mkdir(parents=True)
    kubelet = KubeletSimulator(short_dir)
    with pytest.raises(KubeletError, match="cannot listen on"):
        async with kubelet:
            pytest.fail("a start that failed must not enter")
    assert unix_grpc.probe(kubelet.pod_resources_socket) is SocketState.MISSING
    assert (short_dir / "device-plugins" / "kubelet.sock").is_dir()  # not ours: left as it was
