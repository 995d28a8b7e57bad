"""DirectoryWatch over real inotify: bursts as one batch, renames, a removed directory."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from sharing_plugin.kit.fswatch import Change, DirectoryGone, DirectoryWatch, FileChange


async def test_a_burst_comes_as_one_batch_in_order(tmp_path: Path) -> None:
    async with DirectoryWatch(tmp_path, debounce_s=0.05) as watch:
        (tmp_path / "a").write_text("1")
        (tmp_path / "b").write_text("2")
        (tmp_path / "a").unlink()
        batch = await asyncio.wait_for(watch.changes(), 2)
    kinds = [(c.change, c.path.name) for c in batch]
    assert kinds[0] == (Change.ADDED, "a")
    assert (Change.ADDED, "b") in kinds
    assert kinds[-1] == (Change.DELETED, "a")


async def test_configmap_style_swap_is_seen_as_renames(tmp_path: Path) -> None:
    (tmp_path / "..2024_old").mkdir()
    os.symlink("..2024_old", tmp_path / "..data")
    async with DirectoryWatch(tmp_path, debounce_s=0.05) as watch:
        (tmp_path / "..2024_new").mkdir()
        os.symlink("..2024_new", tmp_path / "..data_tmp")
        os.rename(tmp_path / "..data_tmp", tmp_path / "..data")
        batch = await asyncio.wait_for(watch.changes(), 2)
    assert FileChange(Change.ADDED, tmp_path / "..data") in batch
    assert FileChange(Change.DELETED, tmp_path / "..data_tmp") in batch


async def test_changes_armed_before_enter_returns_are_not_lost(tmp_path: Path) -> None:
    async with DirectoryWatch(tmp_path) as watch:
        (tmp_path / "x").touch()  # right after entering, before anyone waits
        await asyncio.sleep(0.1)
        batch = await asyncio.wait_for(watch.changes(), 2)
    assert FileChange(Change.ADDED, tmp_path / "x") in batch


async def test_removed_directory_ends_the_watch(tmp_path: Path) -> None:
    watched = tmp_path / "d"
    watched.mkdir()
    async with DirectoryWatch(watched, debounce_s=0.05) as watch:
        (watched / "f").touch()
        (watched / "f").unlink()
        watched.rmdir()
        batch = await asyncio.wait_for(watch.changes(), 2)
        assert (batch[0].change, batch[-1].change) == (Change.ADDED, Change.DELETED)
        with pytest.raises(DirectoryGone):
            await asyncio.wait_for(watch.changes(), 2)


async def test_a_quiet_directory_gives_nothing_and_cancels_cleanly(tmp_path: Path) -> None:
    async with DirectoryWatch(tmp_path) as watch:
        waiting = asyncio.create_task(watch.changes())
        done, _ = await asyncio.wait([waiting], timeout=0.2)
        assert not done
        waiting.cancel()
        await asyncio.wait([waiting])
        assert waiting.cancelled()
        (tmp_path / "late").touch()  # the watch still works after a cancelled wait
        batch = await asyncio.wait_for(watch.changes(), 2)
    assert FileChange(Change.ADDED, tmp_path / "late") in batch


async def test_a_missing_directory_cannot_be_watched(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        async with DirectoryWatch(tmp_path / "missing"):
            pass


async def test_no_event_is_lost_when_quiet_timeouts_race_the_reader(tmp_path: Path) -> None:
    """A quiet-time timeout that lands in the loop turn where the descriptor becomes readable
    must not drop what the reader took (it did while each get() was cancelled on timeout)."""
    names = [f"f{n}" for n in range(600)]
    seen: set[str] = set()
    async with DirectoryWatch(tmp_path, debounce_s=0.0005, max_batch_s=0.002) as watch:

        async def consume() -> None:
            while len(seen) < len(names):
                for change in await watch.changes():
                    if change.change is Change.ADDED:
                        seen.add(change.path.name)

        consumer = asyncio.create_task(consume())
        for n, name in enumerate(names):
            (tmp_path / name).touch()
            if n % 3 == 0:
                await asyncio.sleep(0.0005 * (n % 4))
        await asyncio.wait_for(consumer, 10)
    assert seen == set(names)
