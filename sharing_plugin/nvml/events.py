"""Health events: NVML Xid critical errors and ECC errors, delivered to asyncio as
(device UUID, Xid, kind).

``nvmlEventSetWait`` blocks and cannot be interrupted (freeing the event set from another thread
while it waits is unsafe), so a worker thread owns the event set and waits with a bounded
timeout (`wait_ms`); events cross into the loop with ``call_soon_threadsafe``. Closing the watch
does not wait for that thread: it is told to stop and left to finish on its own, freeing its
event set and ending its NVML session when its current wait returns, and delivering nothing
more. So a stop, a restart or a daemon shutdown never waits out an NVML wait; the thread is a
daemon thread and holds nothing that keeps the process alive. An event arriving while a closed
watch's thread still waits is dropped by it (a restarted watch has its own event set by then).

An Xid that NVML attributes to a GPU instance / compute instance is mapped to that MIG device's
UUID (as the reference plugin does); an unattributed one names the whole GPU, meaning every
device on it. NVML fills the instance ids and ``eventData`` only for Xid events, so an ECC
event always names the whole GPU and carries Xid 0.

Which event types are registered is the caller's choice (the config's ``health.eventTypes``;
by default all three, as the reference does). A GPU registers the chosen types it supports
(``nvmlDeviceGetSupportedEventTypes``: GPUs without ECC, or with ECC turned off, report no
ECC events); a type it lacks is logged and skipped for that GPU only.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import threading
from typing import NamedTuple

from sharing_plugin.errors import NvmlError
from sharing_plugin.gpus.health_tracker import EVERY_EVENT_KIND, EventKind
from sharing_plugin.gpus.inventory import Inventory
from sharing_plugin.kit.lifecycle import Service
from sharing_plugin.nvml.api import DeviceHandle, EventData, EventSetHandle, NvmlApi
from sharing_plugin.nvml.calls import is_code, nvml_errors, text, to_nvml_error

log = logging.getLogger(__name__)

# How long one nvmlEventSetWait may block: the reference plugin's health check waits 5 s too.
# Nothing waits for it (see above), so it bounds only how often an idle node wakes this thread.
EVENT_WAIT_MS = 5000
_NOT_ATTRIBUTED = 0xFFFFFFFF  # NVML's GPU/compute-instance id when an event has none

_WORDS = {
    EventKind.XID: "Xid",
    EventKind.DOUBLE_BIT_ECC: "double-bit ECC",
    EventKind.SINGLE_BIT_ECC: "single-bit ECC",
}


def _event_type(nvml: NvmlApi, kind: EventKind) -> int:
    """NVML's event type bit of each kind."""
    if kind is EventKind.XID:
        return int(nvml.nvmlEventTypeXidCriticalError)
    if kind is EventKind.DOUBLE_BIT_ECC:
        return int(nvml.nvmlEventTypeDoubleBitEccError)
    return int(nvml.nvmlEventTypeSingleBitEccError)


class NvmlEvent(NamedTuple):
    """One health event: the UUID of the device it hit (a GPU or a MIG device), the Xid number
    (0 for an ECC event) and what kind of event it is."""

    uuid: str
    xid: int
    kind: EventKind = EventKind.XID


def describe_kinds(kinds: frozenset[EventKind]) -> str:
    """``Xid, double-bit ECC`` -- the event kinds in a fixed order, for log lines."""
    return ", ".join(_WORDS[k] for k in EventKind if k in kinds) or "no"


class _Ready:
    pass


_READY = _Ready()


class NvmlEventWatch(Service):
    """An async context manager and iterator of `NvmlEvent`s for the inventory's GPUs.

    ``async with NvmlEventWatch(nvml, inventory) as events: async for event in events: ...``
    `kinds` are the events to register (default: every kind). Registration failures of single
    GPUs are logged and skipped (old GPUs lack Xid events); an NVML failure of the watch itself
    ends the iteration with `NvmlError`. Leaving the ``async with`` returns at once; `released`
    is set once the thread has freed its event set and ended its NVML session.
    """

    def __init__(
        self,
        nvml: NvmlApi,
        inventory: Inventory,
        *,
        wait_ms: int = EVENT_WAIT_MS,
        kinds: frozenset[EventKind] = EVERY_EVENT_KIND,
    ) -> None:
        self._nvml = nvml
        self._inventory = inventory
        self._wait_ms = wait_ms
        self._kinds = kinds
        self._stop = threading.Event()
        self._queue: asyncio.Queue[NvmlEvent | BaseException | _Ready] = asyncio.Queue()
        self._thread: threading.Thread | None = None
        self.unwatched: list[str] = []  # GPU UUIDs whose events could not be registered
        self.unsupported: dict[str, frozenset[EventKind]] = {}  # GPU UUID -> kinds it lacks
        self.released = threading.Event()
        """Set when the thread has freed its event set and shut its NVML session down."""
        self._uuid_by_handle: dict[int | None, str] = {}

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        # A daemon thread, not the loop's executor: a thread abandoned in an NVML wait must
        # not hold up the process's exit (the executor's threads are joined at exit).
        self._thread = threading.Thread(
            target=self._run, args=(loop,), name="nvml-health-events", daemon=True
        )
        self._thread.start()
        first = await self._queue.get()  # a cancelled wait stops the thread on close
        if isinstance(first, BaseException):
            raise first  # the thread has already cleaned up

    async def close(self) -> None:
        # No join: the thread ends after its current NVML wait, on its own (see above).
        self._stop.set()

    def __aiter__(self) -> NvmlEventWatch:
        return self

    async def __anext__(self) -> NvmlEvent:
        if self._thread is None:
            raise RuntimeError("use 'async with NvmlEventWatch(...)' before iterating")
        item = await self._queue.get()
        if isinstance(item, BaseException):
            raise item
        assert isinstance(item, NvmlEvent)
        return item

    # ---- in the thread ----

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        nvml = self._nvml

        def send(item: NvmlEvent | BaseException | _Ready) -> None:
            if self._stop.is_set():
                return  # closed: nobody reads the queue any more
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._queue.put_nowait, item)

        try:
            with nvml_errors(nvml, "initialising NVML for health events"):
                nvml.nvmlInit()
        except NvmlError as exc:
            self.released.set()
            send(exc)
            return
        failure: BaseException | None = None
        event_set: EventSetHandle | None = None
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
            failure = exc
        except Exception as exc:  # a bug must surface in the loop, not die in the thread
            log.exception("NVML health-event thread failed")
            failure = exc
        finally:
            self._release(event_set)
        if failure is not None:
            send(failure)  # after the clean-up: a failed watch has left NVML as it found it

    def _release(self, event_set: EventSetHandle | None) -> None:
        nvml = self._nvml
        if event_set is not None:
            try:
                nvml.nvmlEventSetFree(event_set)
            except nvml.NVMLError as exc:
                log.warning("%s", to_nvml_error(nvml, exc, "freeing the NVML event set"))
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError as exc:
            log.warning("%s", to_nvml_error(nvml, exc, "shutting NVML down"))
        self.released.set()

    def _register(self, event_set: EventSetHandle) -> None:
        nvml = self._nvml
        wanted = {kind: _event_type(nvml, kind) for kind in self._kinds}
        if not wanted:
            return  # nothing to watch: the watch only waits
        words = describe_kinds(self._kinds)
        for gpu in self._inventory.gpus:
            if not gpu.healthy_at_discovery:
                continue
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
                supported = int(nvml.nvmlDeviceGetSupportedEventTypes(handle))
                lacking = frozenset(k for k, bit in wanted.items() if not supported & bit)
                if lacking == frozenset(wanted):
                    raise nvml.NVMLError(nvml.NVML_ERROR_NOT_SUPPORTED)
                if lacking:
                    # nvmlDeviceRegisterEvents fails with NOT_SUPPORTED when any requested type
                    # is unsupported, so those are left out for this GPU only.
                    log.info(
                        "GPU %d (%s) does not report %s events%s; they are not watched on it",
                        gpu.index,
                        gpu.uuid,
                        describe_kinds(lacking),
                        "" if EventKind.XID in lacking else " (its ECC is off, or it has none)",
                    )
                    self.unsupported[gpu.uuid] = lacking
                mask = sum(bit for k, bit in wanted.items() if k not in lacking)
                nvml.nvmlDeviceRegisterEvents(handle, mask, event_set)
                self._uuid_by_handle[_handle_key(handle)] = gpu.uuid
            except nvml.NVMLError as exc:
                error = to_nvml_error(nvml, exc, f"GPU {gpu.index} ({gpu.uuid}): {words} events")
                log.warning("%s: its health is not watched", error)
                self.unwatched.append(gpu.uuid)

    def _wait(self, event_set: EventSetHandle) -> NvmlEvent | None:
        nvml = self._nvml
        try:
            data = nvml.nvmlEventSetWait_v2(event_set, self._wait_ms)
        except nvml.NVMLError as exc:
            if is_code(exc, nvml.NVML_ERROR_TIMEOUT):
                return None
            raise to_nvml_error(nvml, exc, "waiting for NVML events") from exc
        event_type = int(data.eventType)
        kind = next((k for k in self._kinds if event_type & _event_type(nvml, k)), None)
        if kind is None:
            return None
        # NVML documents eventData and the instance ids for Xid events only.
        xid = int(data.eventData) if kind is EventKind.XID else 0
        what = f"Xid {xid}" if kind is EventKind.XID else f"a {_WORDS[kind]} error"
        # By handle first: a GPU that fell off the bus (Xid 79) no longer answers for its UUID.
        gpu_uuid = self._uuid_by_handle.get(_handle_key(data.device))
        if gpu_uuid is None:
            with nvml_errors(nvml, f"identifying the GPU of {what}"):
                gpu_uuid = text(nvml.nvmlDeviceGetUUID(data.device))
        if kind is not EventKind.XID:
            return NvmlEvent(gpu_uuid, 0, kind)
        return NvmlEvent(self._attribute(gpu_uuid, data), xid)

    def _attribute(self, gpu_uuid: str, data: EventData) -> str:
        gi_id, ci_id = int(data.gpuInstanceId), int(data.computeInstanceId)
        gpu = self._inventory.gpu(gpu_uuid)
        if gpu is None or _NOT_ATTRIBUTED in (gi_id, ci_id):
            return gpu_uuid
        for mig in gpu.mig_devices:
            if (mig.gi_id, mig.ci_id) == (gi_id, ci_id):
                return mig.uuid
        return gpu_uuid  # a MIG device created after discovery: the whole GPU is suspect


def _handle_key(handle: DeviceHandle) -> int | None:
    """A device handle's identity: pynvml hands out a new ctypes pointer object per call, so
    real handles compare by the address they hold; other handles by object identity."""
    if isinstance(handle, ctypes._Pointer):
        return ctypes.cast(handle, ctypes.c_void_p).value
    return id(handle)
