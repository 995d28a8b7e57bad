"""The metrics address over real TCP sockets on 127.0.0.1, with a raw asyncio client."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from sharing_plugin.errors import MetricsServerError
from sharing_plugin.mig.state import GpuMigState, MigState
from sharing_plugin.observability import Metrics, MetricsServer, StatusBoard

GPU = "nvidia.com/gpu"


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes


async def exchange(port: int, raw: bytes, *, host: str = "127.0.0.1") -> Response:
    """Send raw bytes, read until the server closes, parse the response."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(raw)
        await writer.drain()
        data = await reader.read()
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("ascii").split("\r\n")
    version, code, _ = status_line.split(" ", 2)
    assert version == "HTTP/1.1"
    headers = {k.lower(): v.strip() for k, v in (h.split(":", 1) for h in header_lines)}
    assert int(headers["content-length"]) == len(body) or raw.startswith(b"HEAD")
    assert headers["connection"] == "close"
    return Response(int(code), headers, body)


async def get(port: int, path: str) -> Response:
    return await exchange(port, f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())


@pytest.fixture
async def served() -> AsyncIterator[MetricsServer]:
    async with MetricsServer("127.0.0.1", 0, Metrics(), StatusBoard(), read_timeout=0.3) as s:
        yield s


async def test_metrics_reflect_updates(served: MetricsServer) -> None:
    served.metrics.set_devices(GPU, total=8, healthy=6)
    served.metrics.count_reload(False)
    first = await get(served.port, "/metrics")
    assert first.status == 200
    assert first.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    text = first.body.decode()
    assert 'sharing_plugin_devices{resource="nvidia.com/gpu"} 8.0' in text
    assert 'sharing_plugin_healthy_devices{resource="nvidia.com/gpu"} 6.0' in text
    assert 'sharing_plugin_reloads_total{result="failed"} 1.0' in text

    served.metrics.set_devices(GPU, total=8, healthy=8)
    again = await get(served.port, "/metrics?name=ignored")
    assert 'sharing_plugin_healthy_devices{resource="nvidia.com/gpu"} 8.0' in again.body.decode()


async def test_healthz(served: MetricsServer) -> None:
    response = await get(served.port, "/healthz")
    assert (response.status, response.body) == (200, b"ok\n")


async def test_readyz_goes_from_503_to_200_when_everything_is_registered(
    served: MetricsServer,
) -> None:
    not_loaded = await get(served.port, "/readyz")
    assert not_loaded.status == 503
    assert b"no config loaded" in not_loaded.body

    served.status.set_config(name="default", hash="h1")
    served.status.set_resource(GPU, devices=8, healthy=8)
    waiting = await get(served.port, "/readyz")
    assert waiting.status == 503
    assert GPU.encode() in waiting.body

    served.status.set_registered(GPU, True)
    ready = await get(served.port, "/readyz")
    assert ready.status == 200


async def test_status_json(served: MetricsServer) -> None:
    served.status.set_config(name="a100", hash="h1")
    served.status.set_resource(GPU, devices=8, healthy=7, draining=["GPU-a::1"], registered=True)
    served.status.set_error("cfg.yaml:3:5: version: unknown version 'v2'")
    served.status.set_mig_states({"GPU-a": GpuMigState(MigState.PENDING, "held by a pod")})
    response = await get(served.port, "/status")
    assert response.status == 200
    assert response.headers["content-type"] == "application/json"
    doc = json.loads(response.body)
    assert set(doc["config"]) >= {"name", "hash", "generation", "loadedAt"}
    assert doc["config"]["name"] == "a100"
    assert doc["config"]["loadedAt"].endswith("Z")
    assert doc["lastError"] == "cfg.yaml:3:5: version: unknown version 'v2'"
    assert doc["resources"][GPU] == {
        "devices": 8,
        "healthy": 7,
        "draining": ["GPU-a::1"],
        "registered": True,
    }
    assert doc["mig"] == {"GPU-a": {"state": "pending", "reason": "held by a pod"}}


async def test_unknown_path_is_404_and_other_methods_405(served: MetricsServer) -> None:
    missing = await get(served.port, "/nope")
    assert missing.status == 404
    assert b"/metrics" in missing.body
    post = await exchange(served.port, b"POST /metrics HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi")
    assert post.status == 405
    assert post.headers["allow"] == "GET, HEAD"
    head = await exchange(served.port, b"HEAD /healthz HTTP/1.1\r\n\r\n")
    assert head.status == 200
    assert head.body == b""
    assert head.headers["content-length"] == "3"


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", 400),  # a TLS ClientHello
        (b"GET\r\n\r\n", 400),
        (b"GET /metrics SPDY/3\r\n\r\n", 400),
        (b"GET /m\xffx HTTP/1.1\r\n\r\n", 400),
        (b"GET /" + b"a" * 10_000 + b" HTTP/1.1\r\n\r\n", 431),
        (b"GET / HTTP/1.1\r\n" + b"X-A: b\r\n" * 2000 + b"\r\n", 431),
    ],
)
async def test_garbage_gets_an_error_and_the_server_keeps_serving(
    served: MetricsServer, raw: bytes, status: int
) -> None:
    response = await exchange(served.port, raw)
    assert response.status == status
    assert (await get(served.port, "/healthz")).status == 200


async def test_bare_lf_line_endings_are_accepted(served: MetricsServer) -> None:
    response = await exchange(served.port, b"GET /healthz HTTP/1.0\n\n")
    assert response.status == 200


async def test_slow_or_silent_clients_time_out_without_blocking_others(
    served: MetricsServer,
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    writer.write(b"GET /healthz HT")  # ...and never finishes the request
    await writer.drain()
    # meanwhile other clients are served at once
    assert (await get(served.port, "/healthz")).status == 200
    data = await asyncio.wait_for(reader.read(), timeout=5)
    assert data.startswith(b"HTTP/1.1 408 ")
    writer.close()
    await writer.wait_closed()

    # a client that connects and goes away without a word costs nothing
    _, writer = await asyncio.open_connection("127.0.0.1", served.port)
    writer.close()
    await writer.wait_closed()
    assert (await get(served.port, "/healthz")).status == 200


async def refused(port: int, path: str, within: float = 5.0) -> None:
    """Wait until `path` is answered 503: the connection cap is full."""
    async with asyncio.timeout(within):
        # The server tells nothing of the connections it has accepted but its answers.
        while (await get(port, path)).status != 503:  # noqa: ASYNC110
            await asyncio.sleep(0.01)


async def test_past_the_connection_cap_only_probes_are_answered() -> None:
    async with MetricsServer(
        "127.0.0.1", 0, Metrics(), StatusBoard(), read_timeout=5, max_connections=2
    ) as server:
        idle = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(2)]
        # Once the server has accepted both, a scrape is refused.
        await refused(server.port, "/metrics")
        assert (await get(server.port, "/status")).status == 503
        assert (await get(server.port, "/healthz")).status == 200
        assert (await get(server.port, "/readyz")).status == 503  # not ready: no config
        assert b"no config loaded" in (await get(server.port, "/readyz")).body
        for _, writer in idle:
            writer.close()
            await writer.wait_closed()


async def test_liveness_probe_answers_through_a_reconnecting_connection_flood() -> None:
    """Issue 16: 100 half-open connections that reconnect when closed held every slot of the
    cap for their read timeout, and /healthz answered 503 for as long as the flood lasted."""
    async with MetricsServer("127.0.0.1", 0, Metrics(), StatusBoard(), read_timeout=2) as server:
        connected = 0

        async def half_open_forever() -> None:
            nonlocal connected
            while True:
                try:
                    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
                except OSError:
                    continue
                connected += 1
                try:
                    writer.write(b"GET /metr")  # ...and never finishes the request
                    await reader.read()  # until the server gives up on us
                except ConnectionError:
                    pass
                finally:
                    writer.close()

        flood = [asyncio.create_task(half_open_forever()) for _ in range(100)]
        try:
            async with asyncio.timeout(5):
                while connected < 100:  # noqa: ASYNC110 -- the flood has no event to wait on
                    await asyncio.sleep(0.01)
            await refused(server.port, "/metrics")  # every slot of the cap is taken
            statuses = []
            for _ in range(10):
                started = asyncio.get_running_loop().time()
                statuses.append((await get(server.port, "/healthz")).status)
                assert asyncio.get_running_loop().time() - started < 1.0
                await asyncio.sleep(0.05)
            assert statuses == [200] * 10
            assert (await get(server.port, "/metrics")).status == 503
        finally:
            for task in flood:
                task.cancel()
            await asyncio.gather(*flood, return_exceptions=True)


async def test_close_ends_connections_stuck_mid_request() -> None:
    server = MetricsServer("127.0.0.1", 0, Metrics(), StatusBoard(), read_timeout=30)
    await server.start()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /")
    await writer.drain()
    await asyncio.sleep(0.05)
    await asyncio.wait_for(server.close(), timeout=2)
    assert await asyncio.wait_for(reader.read(), timeout=2) == b""
    writer.close()
    await writer.wait_closed()
    with pytest.raises(RuntimeError):
        _ = server.port


async def test_port_in_use_is_a_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(MetricsServerError, match=f"127.0.0.1:{port}.*'off'"):
            async with MetricsServer("127.0.0.1", port, Metrics(), StatusBoard()):
                pass


async def test_ipv6_loopback() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 in this kernel")
    try:
        server = MetricsServer("::1", 0, Metrics(), StatusBoard())
        await server.start()
    except MetricsServerError:
        pytest.skip("::1 not configured here")
    try:
        assert server.url == f"http://[::1]:{server.port}"
        response = await exchange(server.port, b"GET /healthz HTTP/1.1\r\n\r\n", host="::1")
        assert response.status == 200
    finally:
        await server.close()


async def test_many_concurrent_scrapes(served: MetricsServer) -> None:
    served.metrics.set_devices(GPU, total=7168, healthy=7168)
    responses = await asyncio.gather(*(get(served.port, "/metrics") for _ in range(40)))
    assert all(r.status == 200 for r in responses)
    assert all(b"7168.0" in r.body for r in responses)


async def test_refresh_runs_before_metrics_and_status_and_its_failure_is_no_outage() -> None:
    asked: list[str] = []
    metrics = Metrics()

    async def refresh() -> None:
        asked.append("refresh")
        if len(asked) > 2:
            raise RuntimeError("NVML went away")
        metrics.set_devices(GPU, total=len(asked), healthy=0)  # what the request then shows

    async with MetricsServer("127.0.0.1", 0, metrics, StatusBoard(), refresh=refresh) as s:
        first = await get(s.port, "/metrics")
        assert b'sharing_plugin_devices{resource="nvidia.com/gpu"} 1.0' in first.body
        assert (await get(s.port, "/status")).status == 200
        assert (await get(s.port, "/healthz")).status == 200  # probes do not read anything
        failed = await get(s.port, "/metrics")
        assert failed.status == 200  # served from what is there
        assert b'sharing_plugin_devices{resource="nvidia.com/gpu"} 2.0' in failed.body
    assert asked == ["refresh"] * 3
