"""The demo's hot-reload loop: it prints the node again after each edit of its config file."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from sharing_plugin.cli.demo import run_demo


async def _printed(lines: list[str], text: str, within: float = 5.0) -> None:
    async with asyncio.timeout(within):
        while not any(text in line for line in lines):  # noqa: ASYNC110 -- output has no event
            await asyncio.sleep(0.02)


async def test_demo_prints_the_node_after_each_edit_and_rejects_a_typo(short_dir: Path) -> None:
    lines: list[str] = []
    demo = asyncio.create_task(run_demo(once=False, say=lines.append, workdir=short_dir))
    try:
        await _printed(lines, "to hot-reload it")
        assert "  nvidia.com/gpu.shared: 16" in lines
        config = short_dir / "config.yaml"
        config.write_text(config.read_text().replace("replicas: 4", "replicas: 8"))
        await _printed(lines, "nvidia.com/gpu.shared: 32")
        config.write_text(config.read_text().replace("replicas: 8", "replica: 8"))
        await _printed(lines, "config rejected, the last good one keeps serving")
        rejected = next(line for line in lines if "config rejected" in line)
        assert "config.yaml:20:9" in rejected and "did you mean 'replicas'" in rejected
    finally:
        demo.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await demo
