"""ConfigSource against real files, real symlink swaps and real inotify notifications."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from k8s_fake import ConfigMapVolume

from sharing_plugin.sources.filewatch import ConfigSource
from sharing_plugin.sources.update import ConfigUpdate, Trigger


def config(replicas: int, name: str = "nvidia.com/gpu") -> str:
    return (
        "version: v1\n"
        "sharing:\n"
        "  timeSlicing:\n"
        "    resources:\n"
        f"    - name: {name}\n"
        f"      replicas: {replicas}\n"
    )


def replicas(update: ConfigUpdate) -> int:
    assert update.error is None, str(update.error)
    assert update.loaded is not None
    sharing = update.loaded.config.sharing.time_slicing
    assert sharing is not None
    return sharing.resources[0].replicas


class Updates:
    """Consumes `source.updates()` in a task; `next()` waits (bounded) for the next one."""

    def __init__(self, source: ConfigSource) -> None:
        self.source = source
        self.queue: asyncio.Queue[ConfigUpdate] = asyncio.Queue()
        self.task = asyncio.create_task(self._run(), name="updates-consumer")

    async def _run(self) -> None:
        async for update in self.source.updates():
            self.queue.put_nowait(update)

    async def next(self, within: float = 5.0) -> ConfigUpdate:
        return await asyncio.wait_for(self.queue.get(), within)

    async def until(self, want: int, within: float = 5.0) -> ConfigUpdate:
        """Skip intermediate updates until one with `want` replicas arrives."""
        async with asyncio.timeout(within):
            while True:
                update = await self.queue.get()
                if update.error is None and replicas(update) == want:
                    return update


@contextlib.asynccontextmanager
async def watching(source: ConfigSource) -> AsyncIterator[Updates]:
    updates = Updates(source)
    try:
        yield updates
    finally:
        source.stop()
        await asyncio.wait_for(updates.task, 5)


def test_no_path_means_default_config() -> None:
    update = ConfigSource(None).read()
    assert (update.name, update.loaded, update.error, update.trigger) == (
        None,
        None,
        None,
        Trigger.START,
    )


async def test_file_edit_yields_new_config(tmp_path: Path) -> None:
    file = tmp_path / "config.yaml"
    file.write_text(config(2))
    source = ConfigSource(file)
    first = source.read()
    assert replicas(first) == 2 and first.name is None
    async with watching(source) as updates:
        file.write_text(config(5))
        update = await updates.next()
        assert replicas(update) == 5
        assert update.trigger is Trigger.FILE_CHANGED
        assert update.loaded is not None and update.loaded.file == str(file)


async def test_change_before_watch_is_not_lost(tmp_path: Path) -> None:
    file = tmp_path / "config.yaml"
    file.write_text(config(2))
    source = ConfigSource(file)
    source.read()
    file.write_text(config(3))  # after read(), before the watch exists
    async with watching(source) as updates:
        assert replicas(await updates.next()) == 3


async def test_configmap_symlink_swap(tmp_path: Path) -> None:
    volume = ConfigMapVolume(tmp_path / "cm", {"default": config(2), "big": config(8)})
    source = ConfigSource(volume.root)
    first = source.read()
    assert first.name == "default" and replicas(first) == 2
    async with watching(source) as updates:
        volume.update({"default": config(4), "big": config(8)})
        update = await updates.next()
        assert update.name == "default" and replicas(update) == 4
        assert update.loaded is not None
        assert update.loaded.file == str(volume.root / "default")
        # Another swap after the old target directory is gone is still seen.
        volume.update({"default": config(6), "big": config(8)})
        assert replicas(await updates.next()) == 6


async def test_edit_of_another_key_is_not_an_update(tmp_path: Path) -> None:
    volume = ConfigMapVolume(tmp_path / "cm", {"default": config(2), "big": config(8)})
    source = ConfigSource(volume.root)
    source.read()
    async with watching(source) as updates:
        volume.update({"default": config(2), "big": config(9)})
        volume.update({"default": config(3), "big": config(9)})
        update = await updates.next()
        assert replicas(update) == 3  # the edit of 'big' alone produced nothing


async def test_burst_of_edits_last_wins(tmp_path: Path) -> None:
    volume = ConfigMapVolume(tmp_path / "cm", {"default": config(1)})
    source = ConfigSource(volume.root)
    source.read()
    async with watching(source) as updates:
        for n in range(2, 22):
            volume.update({"default": config(n)})
        await updates.until(21)
        # Nothing after the last one: the update that follows is the next edit's, not a stale
        # one from the burst.
        volume.update({"default": config(22)})
        assert replicas(await updates.next()) == 22


async def test_burst_of_file_writes_last_wins(tmp_path: Path) -> None:
    file = tmp_path / "config.yaml"
    file.write_text(config(1))
    source = ConfigSource(file)
    source.read()
    async with watching(source) as updates:
        for n in range(2, 22):
            file.write_text(config(n))
        seen = await updates.until(21)
        assert seen.error is None
        file.write_text(config(22))
        assert replicas(await updates.next()) == 22


async def test_invalid_edit_then_fix(tmp_path: Path) -> None:
    file = tmp_path / "config.yaml"
    file.write_text(config(2))
    source = ConfigSource(file)
    source.read()
    async with watching(source) as updates:
        file.write_text(config(0))
        update = await updates.next()
        assert update.error is not None and update.loaded is None
        assert [str(p) for p in update.error.problems] == [
            f"{file}:6:17: sharing.timeSlicing.resources[0].replicas: must be >= 1 (got 0)"
        ]
        file.write_text(config(3))
        assert replicas(await updates.next()) == 3


async def test_deleted_file_then_recreated(tmp_path: Path) -> None:
    file = tmp_path / "config.yaml"
    file.write_text(config(2))
    source = ConfigSource(file)
    source.read()
    async with watching(source) as updates:
        file.unlink()
        update = await updates.next()
        assert update.error is not None
        assert update.error.problems[0].file == str(file)
        assert "cannot read" in str(update.error)
        file.write_text(config(7))
        assert replicas(await updates.next()) == 7


async def test_missing_directory_is_watched_until_it_appears(tmp_path: Path) -> None:
    file = tmp_path / "etc" / "plugin" / "config.yaml"
    source = ConfigSource(file)
    assert source.read().error is not None
    async with watching(source) as updates:
        file.parent.mkdir(parents=True)
        await asyncio.sleep(0.1)  # the watch re-aims at the new directory
        file.write_text(config(4))
        await updates.until(4)


async def test_selected_key_removed_lists_available(tmp_path: Path) -> None:
    volume = ConfigMapVolume(tmp_path / "cm", {"small": config(2), "big": config(8)})
    source = ConfigSource(volume.root, requested_name="small")
    assert replicas(source.read()) == 2
    async with watching(source) as updates:
        volume.update({"big": config(8), "huge": config(16)})
        update = await updates.next()
        assert update.error is not None
        message = str(update.error)
        assert "'small'" in message and "big, huge" in message
        volume.update({"big": config(8), "small": config(3)})
        assert replicas(await updates.next()) == 3


async def test_trigger_rereads_with_new_label(tmp_path: Path) -> None:
    volume = ConfigMapVolume(tmp_path / "cm", {"default": config(2), "big": config(8)})
    label: list[str | None] = [None]
    source = ConfigSource(volume.root, label_value=lambda: label[0])
    assert source.read().name == "default"
    async with watching(source) as updates:
        label[0] = "big"
        source.trigger(Trigger.LABEL_CHANGED)
        update = await updates.next()
        assert (update.name, update.trigger, replicas(update)) == ("big", Trigger.LABEL_CHANGED, 8)
        label[0] = "nope"
        source.trigger(Trigger.LABEL_CHANGED)
        update = await updates.next()
        assert update.error is not None
        assert "unknown config name 'nope'" in str(update.error)
        assert "default, big" in str(update.error) or "big, default" in str(update.error)
        source.trigger(Trigger.SIGHUP)  # reported even though nothing changed
        assert (await updates.next()).trigger is Trigger.SIGHUP


@pytest.mark.parametrize("trigger", [Trigger.SIGHUP, Trigger.LABEL_CHANGED])
async def test_stop_ends_updates_promptly(tmp_path: Path, trigger: Trigger) -> None:
    file = tmp_path / "config.yaml"
    file.write_text(config(2))
    source = ConfigSource(file)
    source.read()
    updates = Updates(source)
    source.trigger(trigger)
    assert (await updates.next()).trigger is trigger
    loop = asyncio.get_running_loop()
    started = loop.time()
    source.stop()
    await asyncio.wait_for(updates.task, 5)
    assert loop.time() - started < 1.0


async def test_cancelling_the_consumer_releases_the_watch(tmp_path: Path) -> None:
    file = tmp_path / "config.yaml"
    file.write_text(config(2))
    source = ConfigSource(file)
    updates = Updates(source)
    assert replicas(await updates.next()) == 2  # no read() before: the first state is yielded
    updates.task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await updates.task
