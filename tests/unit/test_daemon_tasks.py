import asyncio
import logging

import pytest

from sharing_plugin.daemon.tasks import TaskOwner


async def test_close_cancels_every_task() -> None:
    owner = TaskOwner("t")
    started = asyncio.Event()

    async def forever() -> None:
        started.set()
        await asyncio.Event().wait()

    task = owner.spawn(forever(), name="forever", eternal=True)
    await started.wait()
    await owner.close()
    assert task.cancelled()
    assert not owner.tasks


async def test_failure_and_early_end_of_eternal_task_are_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    owner = TaskOwner("t")

    async def boom() -> None:
        raise ValueError("broken pipe")

    async def quits() -> None:
        return None

    caplog.set_level(logging.ERROR)
    await asyncio.gather(
        owner.spawn(boom(), name="boom"),
        owner.spawn(quits(), name="quits", eternal=True),
        return_exceptions=True,
    )
    await asyncio.sleep(0)
    text = caplog.text
    assert "t:boom failed: broken pipe" in text
    assert "t:quits ended although it should run until shutdown" in text
    await owner.close()


async def test_spawn_after_close_is_refused() -> None:
    owner = TaskOwner("t")
    await owner.close()

    async def nothing() -> None:
        return None

    with pytest.raises(RuntimeError, match="while closing"):
        owner.spawn(nothing(), name="late")
