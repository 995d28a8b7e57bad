"""run-dra works with exactly the permissions deploy/dra/ grants (the fake API's RBAC): publish,
republish on reload, prepare a claim, unprepare."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from dra_harness import dra_running
from kube_api import permissions
from kustomize_render import render

ROOT = Path(__file__).resolve().parents[2]
SHARED = """\
version: v1
dra:
  sharedDevices: replicas
sharing:
  timeSlicing:
    renameByDefault: true
    resources:
      - name: gpu
        replicas: {n}
"""

pytestmark = [
    pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed"),
    pytest.mark.kubectl,
]


def granted() -> list[tuple[str, str]]:
    pairs = []
    for doc in render(ROOT / "deploy" / "dra"):
        if doc["kind"] in ("ClusterRole", "Role"):
            for rule in doc["rules"]:
                pairs += [(v, r) for r in rule["resources"] for v in rule["verbs"]]
    return pairs


async def test_the_deployed_permissions_are_enough(short_dir: Path) -> None:
    perms = permissions(*granted())
    async with dra_running(short_dir, SHARED.format(n=2), permissions=perms) as run:
        await run.published(16)
        # The test's own objects go in from the side, as an admin's would.
        ref = run.claim("c", "nvidia.com/gpu.shared")
        answer = await run.prepare(ref)
        assert answer.error == "" and answer.devices
        run.write(SHARED.format(n=3))
        await run.published(24)
        assert await run.unprepare(ref) == ""
    writes = [r for r in run.api.requests if r.method in ("POST", "PUT", "DELETE")]
    assert writes and all(r.headers["authorization"] == "Bearer t" for r in writes)
