"""Broken config edits fuzzed through the daemon's real file watch.

A bad edit must change nothing and say precisely what is wrong (docs/contract.md): the last
good config keeps serving, kubelet sees the same devices, and `/status` shows one line
`FILE:LINE:COL: ...` (no traceback, no Python repr). Writing the good config back is applied as
usual. Each example is two round trips through the watch, so the count stays small.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from daemon_harness import Running, running
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from support.observe import messages_received, open_streams, servers

from sharing_plugin.config.yamldoc import MAX_BYTES

GOOD = b"""\
# A good config the mutations start from.
version: v1
flags:
  migStrategy: none
  failOnInitError: false
  plugin:
    deviceListStrategy: [envvar, volume-mounts]
    deviceIDStrategy: uuid
    passDeviceSpecs: true
sharing:
  timeSlicing:
    renameByDefault: false
    resources:
      - name: nvidia.com/gpu
        devices: [0, 1, "2"]
        replicas: 3
      - name: nvidia.com/gpu
        devices: ["3"]
        replicas: 2
"""
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "20"))
UPDATE_TIMEOUT_S = 5.0
T = TypeVar("T")

_LINES = GOOD.split(b"\n")
_VALUES = [
    b"[]",
    b"{}",
    b"abc",
    b"-1",
    b"0",
    b"1e400",
    b"99999999999999999999999999",
    b"~",
    b"!!binary aGk=",
    b"!!python/object:os.system x",
    b"&a 1",
    b"*a",
    b'"\\ud800"',
    b'"\\x00"',
    b"'a\tb'",
    b"2001-12-14",
    b".nan",
    b"0x7fffffffffffffff",
    b"<<: {}",
    b'"\\u2028"',
]


def _replace_line(i: int, line: bytes) -> bytes:
    return b"\n".join([*_LINES[:i], line, *_LINES[i + 1 :]])


def _wrong_value(i: int, value: bytes) -> bytes:
    key, sep, _ = _LINES[i].partition(b":")
    return _replace_line(i, key + b": " + value if sep else value)


def _flip(flips: list[tuple[int, int]]) -> bytes:
    data = bytearray(GOOD)
    for position, byte in flips:
        data[position % len(data)] = byte
    return bytes(data)


def _insert(position: int, junk: bytes) -> bytes:
    return GOOD[:position] + junk + GOOD[position:]


line_index = st.integers(0, len(_LINES) - 1)
broken = st.one_of(
    st.integers(0, len(GOOD) - 1).map(lambda n: GOOD[:n]),
    st.lists(st.tuples(st.integers(0, len(GOOD)), st.integers(0, 255)), min_size=1, max_size=4).map(
        _flip
    ),
    st.tuples(
        st.integers(0, len(GOOD)),
        st.sampled_from(
            [b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00", b"\t", b"\x1b[31m", b"\r", b"  ", b"- "]
        ),
    ).map(lambda t: _insert(*t)),
    st.tuples(line_index, st.sampled_from(_VALUES)).map(lambda t: _wrong_value(*t)),
    line_index.map(lambda i: b"\n".join(_LINES[:i] + _LINES[i + 1 :])),  # a deleted key
    line_index.map(lambda i: b"\n".join(_LINES[: i + 1] + _LINES[i:])),  # a duplicated key
    st.sampled_from(
        [
            b"version: v1\nflags: &f {migStrategy: none}\nx: *f\n",
            b"a: &a [1]\nb: &b [*a, *a]\nc: [*b, *b]\n",
            b"version: v1\nflags:\n  <<: {migStrategy: none}\n",
            b'version: v1\n"k\\ne": 1\n',
            b"[" * 500 + b"]" * 500,
            b"a:\n" + b"".join(b"  " * n + b"b:\n" for n in range(1, 200)),
            b"--- \n...\n--- \nversion: v1\n",
            b"version: v1\n---\nversion: v1\n",
            b"!!set {a, b}\n",
            b"\xef\xbb\xbf\xef\xbb\xbfversion: v1\n",
            b"version: v2\n",
            b"- version: v1\n",
            b"42\n",
            GOOD + b"#" * MAX_BYTES,
            GOOD.replace(b"replicas: 3", b"replicas: " + b"9" * 5_000),
            GOOD.replace(b"nvidia.com/gpu", b"nvidia.com/" + "g\u00e9pu\u200b".encode()),
        ]
    ),
)

_LOCATED = re.compile(r"^\S+:\d+:\d+: \S")


def _assert_precise(message: str, config: Path) -> None:
    assert "\n" not in message and "\r" not in message, message
    assert "Traceback" not in message and " object at 0x" not in message, message
    assert message.startswith(f"{config}:"), message
    assert _LOCATED.match(message), message
    assert len(message) < 2_000, message[:300]


async def test_broken_edits_change_nothing_and_say_where(short_dir: Path) -> None:
    # Every edit is one rename, never a half-saved file: no need to wait for one to settle.
    async with running(short_dir, GOOD.decode(), config_error_settle_s=0.005) as run:
        await _fuzz(run)


async def _fuzz(run: Running) -> None:
    loop = asyncio.get_running_loop()
    daemon, status = run.daemon, run.daemon.status
    good_devices = {r: run.kubelet.devices(r) for r in run.kubelet.resources()}
    serving = {"plan": daemon.supervisor.advertised}
    assert good_devices and serving["plan"] is not None

    async def edit(data: bytes) -> None:
        with daemon.pipeline.outcomes() as outcomes:  # subscribed before the edit can be seen
            tmp = run.config.with_name(run.config.name + ".tmp")
            tmp.write_bytes(data)
            tmp.replace(run.config)
            await outcomes.next(UPDATE_TIMEOUT_S)

    def on_loop(coro: Coroutine[Any, Any, T]) -> T:
        # Hypothesis runs in a worker thread; the daemon, its watch and kubelet stay on the loop.
        return asyncio.run_coroutine_threadsafe(coro, loop).result(UPDATE_TIMEOUT_S * 3)

    def messages() -> dict[str, int]:
        return {r: messages_received(run.kubelet, r) for r in run.kubelet.resources()}

    async def check_broken(data: bytes) -> None:
        generation = status.to_json()["config"]["generation"]
        sent = messages()
        await edit(data)
        error = status.to_json()["lastError"]
        if error is None:  # the mutation happened to be a valid config: it was applied
            assert status.to_json()["config"]["generation"] == generation + 1
            await run.settled()
        else:
            _assert_precise(error, run.config)
            assert daemon.supervisor.advertised is serving["plan"]
            assert status.to_json()["config"]["generation"] == generation
        await edit(GOOD)
        assert status.to_json()["lastError"] is None
        await run.settled()
        assert {r: run.kubelet.devices(r) for r in run.kubelet.resources()} == good_devices
        if error is not None:
            # Rejected, then the same good config again: kubelet was sent nothing at all. A list
            # pushed for the broken edit would have needed another to put the good one back,
            # and settled() waited for the kubelet to hold the daemon's list, so it would show.
            assert messages() == sent
        serving["plan"] = daemon.supervisor.advertised

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(data=broken)
    # Each once took the daemon down or gave a message on several lines.
    @example(data=_insert(GOOD.index(b"version"), b"\x00"))  # the config watch task died
    @example(data=b'version: v1\n"\\ud800": 1\n')  # half a surrogate pair: not loggable
    @example(data=b'version: v1\n"k\\ne": 1\n')  # a newline inside the dotted path
    def fuzz(data: bytes) -> None:
        assume(data != GOOD)
        on_loop(check_broken(data))

    await asyncio.to_thread(fuzz)
    assert daemon.supervisor.advertised is not None
    assert all(open_streams(s) == 1 for s in servers(daemon.supervisor).values())
