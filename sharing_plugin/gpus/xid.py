"""Health events: NVML Xid critical errors, delivered to asyncio as (device UUID, Xid).

``nvmlEventSetWait`` blocks and cannot be interrupted, so a worker thread owns the event set and
waits with a bounded timeout (`wait_ms`); events cross into the loop with
``call_soon_threadsafe``. Closing the watch stops the thread after at most one more wait. An
event that NVML attributes to a GPU instance / compute instance is mapped to that MIG device's
UUID (as the reference plugin does); an unattributed one names the whole GPU, meaning every
device on it.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import threading
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any, NamedTuple

from sharing_plugin.errors import NvmlError
from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.gpus.nvml_calls import is_code, nvml_errors, text, to_nvml_error

log = logging.getLogger(__name__)

_NOT_ATTRIBUTED = 0xFFFFFFFF  # NVML's GPU/compute-instance id when an event has none


class XidEvent(NamedTuple):
    """One Xid: the UUID of the device it hit (a GPU or a MIG device) and the Xid number."""

    uuid: str
    xid: int


class _Ready:
    pass


_READY = _Ready()


class XidWatch:
    """An async context manager and iterator of `XidEvent`s for the inventory's GPUs.

    ``async with XidWatch(nvml, inventory) as events: async for event in events: ...``
    Registration failures of single GPUs are logged and skipped (old GPUs lack Xid events); an
    NVML failure of the watch itself ends the iteration with `NvmlError`.
    """

    def __init__(self, nvml: Any, inventory: Inventory, *, wait_ms: int = 500) -> None:
        self._nvml = nvml
        self._inventory = inventory
        self._wait_ms = wait_ms
        self._stop = threading.Event()
        self._queue: asyncio.Queue[XidEvent | BaseException | _Ready] = asyncio.Queue()
        self._thread: threading.Thread | None = None
        self.unwatched: list[str] = []  # GPU UUIDs whose events could not be registered
        self._uuid_by_handle: dict[int | None, str] = {}

    async def __aenter__(self) -> XidWatch:
        loop = asyncio.get_running_loop()
        self._thread = threading.Thread(
            target=self._run, args=(loop,), name="nvml-xid-events", daemon=True
        )
        self._thread.start()
        first = await self._queue.get()
        if isinstance(first, BaseException):
            await self._join()
            raise first
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._join()

    def __aiter__(self) -> XidWatch:
        return self

    async def __anext__(self) -> XidEvent:
        if self._thread is None:
            raise RuntimeError("use 'async with XidWatch(...)' before iterating")
        item = await self._queue.get()
        if isinstance(item, BaseException):
            raise item
        assert isinstance(item, XidEvent)
        return item

    async def _join(self) -> None:
        self._stop.set()
        if self._thread is not None:
            # Bounded by one nvmlEventSetWait timeout; shielded so a cancelled caller still
            # leaves the event set freed and NVML shut down.
            await asyncio.shield(asyncio.to_thread(self._thread.join))

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        nvml = self._nvml

        def send(item: XidEvent | BaseException | _Ready) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(self._queue.put_nowait, item)

        try:
            with nvml_errors(nvml, "initialising NVML for health events"):
                nvml.nvmlInit()
        except NvmlError as exc:
            send(exc)
            return
        event_set = None
        try:
            with nvml_errors(nvml, "creating the NVML event set"):
                event_set = nvml.nvmlEventSetCreate()
            self._register(event_set)
            send(_READY)
            while not self._stop.is_set():
                event = self._wait(event_set)
                if event is not None:
                    send(event)
        except NvmlError as exc:
            send(exc)
        except Exception as exc:  # a bug must surface in the loop, not die in the thread
            log.exception("NVML health-event thread failed")
            send(exc)
        finally:
            if event_set is not None:
                try:
                    nvml.nvmlEventSetFree(event_set)
                except nvml.NVMLError as exc:
                    log.warning("%s", to_nvml_error(nvml, exc, "freeing the NVML event set"))
            try:
                nvml.nvmlShutdown()
            except nvml.NVMLError as exc:
                log.warning("%s", to_nvml_error(nvml, exc, "shutting NVML down"))

    def _register(self, event_set: Any) -> None:
        nvml = self._nvml
        xid_type = int(nvml.nvmlEventTypeXidCriticalError)
        for gpu in self._inventory.gpus:
            if not gpu.healthy_at_discovery:
                continue
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
                if not int(nvml.nvmlDeviceGetSupportedEventTypes(handle)) & xid_type:
                    raise nvml.NVMLError(nvml.NVML_ERROR_NOT_SUPPORTED)
                nvml.nvmlDeviceRegisterEvents(handle, xid_type, event_set)
                self._uuid_by_handle[_handle_key(handle)] = gpu.uuid
            except nvml.NVMLError as exc:
                error = to_nvml_error(nvml, exc, f"GPU {gpu.index} ({gpu.uuid}): Xid events")
                log.warning("%s: its health is not watched", error)
                self.unwatched.append(gpu.uuid)

    def _wait(self, event_set: Any) -> XidEvent | None:
        nvml = self._nvml
        try:
            data = nvml.nvmlEventSetWait_v2(event_set, self._wait_ms)
        except nvml.NVMLError as exc:
            if is_code(nvml, exc, "NVML_ERROR_TIMEOUT"):
                return None
            raise to_nvml_error(nvml, exc, "waiting for NVML events") from exc
        if not int(data.eventType) & int(nvml.nvmlEventTypeXidCriticalError):
            return None
        xid = int(data.eventData)
        # By handle first: a GPU that fell off the bus (Xid 79) no longer answers for its UUID.
        gpu_uuid = self._uuid_by_handle.get(_handle_key(data.device))
        if gpu_uuid is None:
            with nvml_errors(nvml, f"identifying the GPU of Xid {xid}"):
                gpu_uuid = text(nvml.nvmlDeviceGetUUID(data.device))
        return XidEvent(self._attribute(gpu_uuid, data), xid)

    def _attribute(self, gpu_uuid: str, data: Any) -> str:
        gi_id, ci_id = int(data.gpuInstanceId), int(data.computeInstanceId)
        gpu = self._inventory.gpu(gpu_uuid)
        if gpu is None or _NOT_ATTRIBUTED in (gi_id, ci_id):
            return gpu_uuid
        for mig in gpu.mig_devices:
            if (mig.gi_id, mig.ci_id) == (gi_id, ci_id):
                return mig.uuid
        return gpu_uuid  # a MIG device created after discovery: the whole GPU is suspect


def _handle_key(handle: Any) -> int | None:
    """A device handle's identity: pynvml hands out a new ctypes pointer object per call, so
    real handles compare by the address they hold; other handles by object identity."""
    if isinstance(handle, ctypes._Pointer):
        return ctypes.cast(handle, ctypes.c_void_p).value
    return id(handle)


async def xid_events(
    nvml: Any, inventory: Inventory, *, wait_ms: int = 500
) -> AsyncIterator[XidEvent]:
    """`XidWatch` as a plain async generator; closing or cancelling it stops the thread."""
    async with XidWatch(nvml, inventory, wait_ms=wait_ms) as watch:
        async for event in watch:
            yield event
