"""The daemon logs a config's notes (what NVIDIA's plugin binary would do otherwise) at INFO."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from daemon_harness import running

RENAMED = (
    "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
    "      - name: nvidia.com/gpu\n        rename: gpu.ts\n        replicas: 2\n"
)


async def test_notes_are_logged_at_info_once_per_config(
    short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sharing_plugin")
    async with running(short_dir, RENAMED) as run:
        assert run.capacity() == {"nvidia.com/gpu.ts": 16}
    notes = [
        r
        for r in caplog.records
        if r.name == "sharing_plugin.daemon.node.pipeline" and r.getMessage().startswith("config: ")
    ]
    assert [(r.levelno, r.getMessage().split(": honoured here")[0]) for r in notes] == [
        (logging.INFO, "config: sharing.timeSlicing.resources[0].rename")
    ]
    assert "advertises nvidia.com/gpu, not nvidia.com/gpu.ts" in notes[0].getMessage()
