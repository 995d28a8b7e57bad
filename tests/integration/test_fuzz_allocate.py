"""Allocate and GetPreferredAllocation fuzzed over the daemon's real unix sockets.

Kubelet is trusted, but a kubelet bug, a version skew or anything else that can reach the socket
must never take a resource down: every request gets a well-formed answer or INVALID_ARGUMENT
(docs/contract.md), and afterwards kubelet's ListAndWatch stream is still open and a normal Allocate
still works. The node mixes whole GPUs (link-scored preferred allocation), MIG devices and
time-sliced MIG replicas, so every allocation path is reached.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from daemon_harness import Running, running
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.observe import open_streams, servers

from sharing_plugin.kubelet.api.deviceplugin.v1beta1 import api_pb2 as dp
from sharing_plugin.kubelet.api.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from sharing_plugin.plan import ResourcePlan

GPU = "nvidia.com/gpu"
SLICED = "nvidia.com/mig-1g.10gb"
NODE = """\
gpus:
  - product: NVIDIA A100-SXM4-80GB
    count: 4
    numaNode: 0
  - product: NVIDIA A100-SXM4-80GB
    numaNode: 1
    mig:
      enabled: true
      instances: ["3g.40gb", "2g.20gb", "1g.10gb@6"]
  - product: NVIDIA A100-SXM4-80GB
    numaNode: 1
    mig:
      enabled: true
      instances: ["1g.10gb", "1g.10gb", "1g.10gb"]
nvlink: all
"""
CONFIG = f"""\
version: v1
flags:
  migStrategy: mixed
sharing:
  timeSlicing:
    resources:
      - name: {SLICED}
        replicas: 3
"""
CALL_TIMEOUT_S = 10.0
INT32_MAX = 2**31 - 1
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "40"))
T = TypeVar("T")


@pytest.fixture
async def node(short_dir: Path) -> AsyncIterator[Running]:
    description = short_dir / "node.yaml"
    description.write_text(NODE, encoding="utf-8")
    async with running(short_dir, CONFIG, gpus=f"simulated:{description}") as run:
        yield run


def _plan(run: Running) -> dict[str, ResourcePlan]:
    advertised = run.daemon.supervisor.advertised
    assert advertised is not None
    return {r.name: r for r in advertised.resources}


def _ids(known: list[str]) -> st.SearchStrategy[str]:
    text = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)
    return st.one_of(
        st.sampled_from(known),
        st.sampled_from(known).map(lambda i: i + "::7"),
        st.sampled_from(known).map(lambda i: i.upper() + " "),
        st.sampled_from(["", "::", "GPU-", "MIG-", "::0", "\x00", "\n", "é🙂", "GPU-x::-1"]),
        text,
        st.sampled_from(["G" * 5_000, "M" * 50_000]),
    )


def _id_lists(known: list[str]) -> st.SearchStrategy[list[str]]:
    return st.one_of(
        st.lists(_ids(known), max_size=12),
        st.lists(st.sampled_from(known), min_size=1, max_size=4, unique=True),
        st.sampled_from(known).map(lambda i: [i] * 10_000),
        st.just([f"GPU-{n}" for n in range(10_000)]),
    )


async def _answer_or_refusal(call: Callable[[], Awaitable[T]]) -> T | None:
    """The call's answer, or None for INVALID_ARGUMENT; any other status fails the test."""
    try:
        return await call()
    except grpc.aio.AioRpcError as exc:
        assert exc.code() is grpc.StatusCode.INVALID_ARGUMENT, (exc.code(), exc.details())
        details = exc.details() or ""
        assert "Traceback" not in details and len(details) <= 2_000, details[:300]
        return None


async def test_fuzzed_requests_get_answers_or_invalid_argument_and_the_server_survives(
    node: Running, caplog: pytest.LogCaptureFixture
) -> None:
    resources = _plan(node)
    assert {GPU, SLICED} <= set(resources) and len(resources[SLICED].devices) == 12
    known = sorted(i for r in resources.values() for i in r.ids)
    sockets = {name: servers(node.daemon.supervisor)[name].socket_path for name in resources}
    channels = {n: grpc.aio.insecure_channel(f"unix://{p}") for n, p in sockets.items()}
    stubs = {n: dp_grpc.DevicePluginStub(c) for n, c in channels.items()}
    names = sorted(resources)
    loop = asyncio.get_running_loop()

    def on_loop(coro: Coroutine[Any, Any, T]) -> T:
        # Hypothesis drives sync functions: it runs in a worker thread and every gRPC call runs
        # on the test's loop, next to the daemon and the kubelet simulator.
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=CALL_TIMEOUT_S * 2)

    allocate_requests = st.lists(_id_lists(known), max_size=6).map(
        lambda lists: dp.AllocateRequest(
            container_requests=[dp.ContainerAllocateRequest(devices_ids=ids) for ids in lists]
        )
    ) | st.just(
        dp.AllocateRequest(
            container_requests=[dp.ContainerAllocateRequest(devices_ids=[known[0]])] * 2_000
        )
    )
    preferred_requests = st.lists(
        st.builds(
            lambda available, must, size: dp.ContainerPreferredAllocationRequest(
                available_deviceIDs=available, must_include_deviceIDs=must, allocation_size=size
            ),
            _id_lists(known),
            _id_lists(known),
            st.one_of(
                st.integers(min_value=0, max_value=16),
                st.sampled_from([-1, -INT32_MAX - 1, INT32_MAX, 10_000]),
            ),
        ),
        max_size=4,
    ).map(lambda reqs: dp.PreferredAllocationRequest(container_requests=reqs))

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(name=st.sampled_from(names), request=allocate_requests)
    def allocate(name: str, request: dp.AllocateRequest) -> None:
        resource = resources[name]
        answer = on_loop(
            _answer_or_refusal(lambda: stubs[name].Allocate(request, timeout=CALL_TIMEOUT_S))
        )
        every_known = all(
            i in resource for req in request.container_requests for i in req.devices_ids
        )
        if answer is None:
            assert not every_known, "a request naming only this resource's IDs was refused"
            return
        assert every_known, "an unknown ID was allocated"
        assert len(answer.container_responses) == len(request.container_requests)
        for req, resp in zip(request.container_requests, answer.container_responses, strict=True):
            visible = resp.envs["NVIDIA_VISIBLE_DEVICES"]
            physical = list(dict.fromkeys(resource.device(i).physical for i in req.devices_ids))  # type: ignore[union-attr]
            assert visible == ",".join(physical)

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(name=st.sampled_from(names), request=preferred_requests)
    def prefer(name: str, request: dp.PreferredAllocationRequest) -> None:
        answer = on_loop(
            _answer_or_refusal(
                lambda: stubs[name].GetPreferredAllocation(request, timeout=CALL_TIMEOUT_S)
            )
        )
        assert answer is not None, "GetPreferredAllocation refused a request"
        assert len(answer.container_responses) == len(request.container_requests)
        for req, resp in zip(request.container_requests, answer.container_responses, strict=True):
            available = set(req.available_deviceIDs)
            ids = list(resp.deviceIDs)
            assert len(ids) == len(set(ids)), "an ID preferred twice"
            assert set(ids) <= available, "an ID outside available preferred"
            required = [i for i in dict.fromkeys(req.must_include_deviceIDs) if i in available]
            assert ids[: len(required)] == required, "must_include not kept first"
            assert len(ids) <= max(req.allocation_size, len(required))

    try:
        await asyncio.to_thread(allocate)
        await asyncio.to_thread(prefer)
    finally:
        for channel in channels.values():
            await channel.close()

    # GetPreferredAllocation answers [] when it fails inside, which the properties above accept.
    failures = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not failures, failures[:3]
    # Still serving: the kubelet's stream is open and a pod is admitted through Allocate.
    for name, resource in _plan(node).items():
        server = servers(node.daemon.supervisor)[name]
        assert open_streams(server) == 1 and server.socket_path == sockets[name]
        assert node.kubelet.capacity(name) == len(resource.devices)
    pod = await node.kubelet.admit_pod("after", containers={"c": {SLICED: 1, GPU: 2}})
    assert len(pod.device_ids("c", GPU)) == 2 and len(pod.device_ids("c", SLICED)) == 1
