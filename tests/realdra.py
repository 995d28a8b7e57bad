"""The real scheduler DRA allocator and kubelet DRA manager (`../shared/tools/realdra.gz`,
Kubernetes 1.32, and `realdra136.gz`, Kubernetes 1.36; their README there), for tests.

Each test runs its own instance (it starts in ~0.1 s with its in-memory API server, or on a
kube-apiserver given by `-kubeconfig`) over its kubelet directory; the binaries are unpacked
once per test run into the run's shared directory (made by tests/conftest.py), under a lock so
the xdist workers unpack each once. Requests are JSON lines, one answer each (`cmd`, `ok`).
Where the tools are absent (a user's clone) the tests that need them skip.
"""

from __future__ import annotations

import asyncio
import fcntl
import gzip
import json
import os
import shutil
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from kustomize_render import SHARED_DIR_ENV

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT.parent / "shared" / "tools"
DRIVER = "gpu.sharing-plugin.io"


def available(name: str) -> bool:
    return (TOOLS / f"{name}.gz").is_file()


def skip_reason(name: str) -> str:
    return f"../shared/tools/{name}.gz is absent (only CI has it)"


def binary(name: str) -> Path:
    """The unpacked binary `name` (`realdra`, `realdra136`), unpacked once per test run."""
    shared = Path(os.environ.get(SHARED_DIR_ENV) or "/tmp")
    path = shared / name
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            partial = path.with_name(f".{name}.partial")
            with gzip.open(TOOLS / f"{name}.gz") as packed, partial.open("wb") as out:
                shutil.copyfileobj(packed, out)
            partial.chmod(0o755)
            partial.replace(path)
    return path


class RealDra:
    """A running realdra process and its JSON-lines control loop (one request, one answer)."""

    def __init__(self, process: asyncio.subprocess.Process, ready: dict[str, Any]) -> None:
        self.process = process
        self.ready = ready
        self._lock = asyncio.Lock()

    @property
    def kubeconfig(self) -> str:
        return str(self.ready["kubeconfig"])

    async def cmd(self, request: dict[str, Any], timeout: float = 15.0) -> dict[str, Any]:  # noqa: ASYNC109
        assert self.process.stdin is not None and self.process.stdout is not None
        async with self._lock, asyncio.timeout(timeout):
            self.process.stdin.write((json.dumps(request) + "\n").encode())
            await self.process.stdin.drain()
            answer: dict[str, Any] = json.loads(await self.process.stdout.readline())
        return answer

    async def ok(self, request: dict[str, Any]) -> dict[str, Any]:
        answer = await self.cmd(request)
        assert answer.get("ok") is True, f"{request['cmd']}: {answer}"
        return answer

    async def create(self, document: dict[str, Any]) -> dict[str, Any]:
        created: dict[str, Any] = (await self.ok({"cmd": "create", "object": document}))["object"]
        return created

    async def claim_for_pod(
        self, name: str, request: dict[str, Any], *, node: str, version: str = "v1"
    ) -> None:
        """A ResourceClaim `name` in `default` with one request (`exactly` in v1, the request
        itself in v1beta1), and a pod of the same name on `node` whose container uses it."""
        body = (
            {"name": "gpu", "exactly": request} if version == "v1" else {"name": "gpu", **request}
        )
        await self.create(
            {
                "apiVersion": f"resource.k8s.io/{version}",
                "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"devices": {"requests": [body]}},
            }
        )
        await self.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {
                    "nodeName": node,
                    "resourceClaims": [{"name": "g", "resourceClaimName": name}],
                    "containers": [
                        {"name": "c", "image": "x", "resources": {"claims": [{"name": "g"}]}}
                    ],
                },
            }
        )

    async def wait_registrations(
        self, count: int, call: str = "RegisterPlugin", within: float = 10.0
    ) -> list[dict[str, Any]]:
        """The kubelet's registration events, once `call` happened `count` times (its plugin
        manager reconciles once a second; asked every 50 ms, as below)."""
        async with asyncio.timeout(within):
            while True:
                events: list[dict[str, Any]] = (await self.ok({"cmd": "registrations"}))["events"]
                if sum(1 for e in events if e["call"] == call) >= count:
                    return events
                await asyncio.sleep(0.05)

    async def slices(self) -> list[dict[str, Any]]:
        found = (await self.ok({"cmd": "list", "kind": "ResourceSlice"})).get("items") or []
        return [s for s in found if s["spec"]["driver"] == DRIVER]

    async def wait_slices(self, devices: int, within: float = 10.0) -> list[dict[str, Any]]:
        """Once the pool holds `devices` devices."""
        return await self.wait_for_slices(
            lambda found: sum(len(s["spec"].get("devices") or ()) for s in found) == devices,
            within,
        )

    async def wait_for_slices(
        self, done: Callable[[list[dict[str, Any]]], bool], within: float = 10.0
    ) -> list[dict[str, Any]]:
        """The driver's slices, once they satisfy `done`. realdra's control loop offers no
        watch, so its API is asked again every 50 ms, within a bound."""
        async with asyncio.timeout(within):
            while True:
                found = await self.slices()
                if done(found):
                    return found
                await asyncio.sleep(0.05)


@asynccontextmanager
async def running(
    name: str, root: Path, *, node: str = "node-1", args: Sequence[str] = ()
) -> AsyncIterator[RealDra]:
    """`name` (`realdra`, `realdra136`) over the kubelet directory `root`, until the block ends."""
    log = (root / f"{name}.log").open("w")
    process = await asyncio.create_subprocess_exec(
        str(binary(name)),
        "-dir",
        str(root),
        "-node",
        node,
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=log,
    )
    try:
        assert process.stdout is not None
        ready = json.loads(await asyncio.wait_for(process.stdout.readline(), 15))
        assert ready["ok"] and ready["event"] == "ready", ready
        dra = RealDra(process, ready)
        yield dra
        await dra.cmd({"cmd": "quit"})
        await asyncio.wait_for(process.wait(), 5)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        log.close()
