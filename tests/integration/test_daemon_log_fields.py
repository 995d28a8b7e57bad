"""The daemon's config lines carry structured fields (what JSON logs show)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from daemon_harness import eventually, running

TIME_SLICING = """\
version: v1
sharing:
  timeSlicing:
    resources:
      - name: nvidia.com/gpu
        replicas: 2
"""


async def test_applied_and_rejected_configs_log_generation_and_reason(
    short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sharing_plugin")
    async with running(short_dir, TIME_SLICING) as run:
        applied = [r for r in caplog.records if "applied" in r.getMessage() and hasattr(r, "hash")]
        assert applied and applied[-1].__dict__["generation"] == 1
        status = run.daemon.status.config
        assert status is not None and applied[-1].__dict__["hash"] == status.hash
        run.write("version: v1\nsharing: {timeSlicing: {resources: nope}}\n")
        await eventually(lambda: any(r.levelno == logging.ERROR for r in caplog.records))
        await eventually(
            lambda: any("keeping the last good" in r.getMessage() for r in caplog.records)
        )
        kept = next(r for r in caplog.records if "keeping the last good" in r.getMessage())
        assert kept.__dict__["generation"] == 1 and kept.__dict__["reason"]
