import asyncio
import logging

import pytest
from support.observe import tasks

from sharing_plugin.kit.tasks import TaskOwner, TasksStuckError


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
    assert not tasks(owner)


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


async def test_a_task_that_ignores_cancellation_fails_close() -> None:
    owner = TaskOwner("t")
    started = asyncio.Event()
    release = asyncio.Event()

    async def stubborn() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await release.wait()  # the bug: cancellation swallowed, the task goes on

    task = owner.spawn(stubborn(), name="stubborn")
    await started.wait()
    with pytest.raises(TasksStuckError, match=r"t: did not stop within 0\.1s: t:stubborn"):
        await owner.close(grace=0.1)
    assert not task.done()
    release.set()
    await task
