"""Preparing claims for containers: the claim's devices -> a CDI spec file and its CDI IDs.

The kubelet sends only each claim's namespace, name and UID; the allocation is read from the
API, and of it the results of this driver in this node's pool are taken. Everything that can be
wrong with one claim (deleted and re-created, not allocated, another driver's, another node's
pool, a device this node no longer has, a request Allocate would refuse) becomes that claim's
error in the answer, which the kubelet shows on the pod and retries; the other claims of the
call are prepared regardless.

A claim allocated a dynamic MIG placement gets its MIG instance made first
(`dra/partitions.py`); if anything after that fails, the instance is destroyed again.

Idempotence: a claim already prepared is answered from the checkpoint without reading the API
again (the kubelet repeats calls after restarts of either side), and unpreparing a claim that is
not prepared succeeds. Calls are serialised, so the checkpoint on disk always matches what was
answered.

The checkpoint, not this object, is what is prepared: while a rolling update runs two instances
over one plugin directory, the kubelet may prepare a claim through one and unprepare it through
the other. Each call reads the file again where another instance replaced it, a prepare adds its
claim by read-merge-write, and an unprepare first takes its claim out of the file under its lock,
so of two instances asked to unprepare one claim only the one that took it out undoes it
(removes its spec file, destroys its MIG instance).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from sharing_plugin.config.model import Flags
from sharing_plugin.config.quantity import quantity_bytes
from sharing_plugin.dra.checkpoint import Checkpoint, PreparedClaim, PreparedDevice
from sharing_plugin.dra.claims import AllocatedDevice, ClaimReader, ClaimRef
from sharing_plugin.dra.partitions import ClaimInstances, Partitioner
from sharing_plugin.errors import AllocationError, KubeApiError, NvmlError
from sharing_plugin.kit.cdi import CdiSpecDir
from sharing_plugin.plan.model import Plan
from sharing_plugin.views.cdi import cdi_id, claim_spec, spec_file_name
from sharing_plugin.views.dra import DraDevice
from sharing_plugin.views.dra_api import DeviceTaint, PublishedDevice, quantity_mib
from sharing_plugin.views.dra_mig import DynamicPool

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PoolState:
    """What the node serves now: its DRA devices by name (healthy or not), plan and flags, and
    its dynamic MIG GPUs (their placement devices are in `mig`, not in `devices`).

    `taints` (GPU or MIG UUID -> taint) is set where the server keeps device taints: Unhealthy
    devices are published tainted, and a claim allocated one (it tolerates the taint, or was
    allocated before it) is prepared. None: Unhealthy devices leave the pool and are not
    prepared.
    """

    devices: Mapping[str, DraDevice]
    plan: Plan
    flags: Flags
    taints: Mapping[str, DeviceTaint] | None = None
    draining: DeviceTaint | None = None  # with taints: on shared devices the config dropped
    mig: DynamicPool = field(default_factory=DynamicPool)
    memory_hook_path: str | None = None  # the CDI hook that caps shares (memoryLimits on)


@dataclass(frozen=True, slots=True)
class PrepareResult:
    """One claim's answer: its devices, or why it could not be prepared."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


class ClaimPreparer:
    """Prepares and unprepares the claims of one driver on one node (pool)."""

    def __init__(
        self,
        *,
        driver: str,
        pool: str,
        claims: ClaimReader,
        specs: CdiSpecDir,
        checkpoint: Checkpoint,
        state: Callable[[], PoolState | None],
        on_change: Callable[[], None] = lambda: None,
        partitioner: Partitioner | None = None,
    ) -> None:
        """`state` tells what the node serves now (None before a first config); `on_change` is
        called after the set of prepared claims changed (what the pool must keep publishing);
        `partitioner` makes and destroys the instances of dynamic MIG placements."""
        self.driver = driver
        self.pool = pool
        self._claims = claims
        self._specs = specs
        self._checkpoint = checkpoint
        self._state = state
        self._on_change = on_change
        checkpoint.load()  # a file that does not check out is set aside now, not at a call
        self._lock = asyncio.Lock()
        self._instances = ClaimInstances(partitioner)

    @property
    def prepared(self) -> Mapping[str, PreparedClaim]:
        """The prepared claims by UID (this instance's and any other's over the same file)."""
        return self._checkpoint.current()

    def held(self) -> dict[str, PublishedDevice]:
        """The devices prepared claims hold, with what was published for each."""
        return {p.name: p for claim in self.prepared.values() for p in claim.published}

    async def prepare(self, refs: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        """Prepare each claim; every claim of `refs` gets an answer keyed by its UID."""
        results: dict[str, PrepareResult] = {}
        async with self._lock:
            before = self.prepared.keys()
            for ref in refs:
                try:
                    results[ref.uid] = PrepareResult(await self._prepare(ref))
                except (AllocationError, KubeApiError) as exc:
                    log.warning("cannot prepare ResourceClaim %s (%s): %s", ref, ref.uid, exc)
                    results[ref.uid] = PrepareResult(error=str(exc))
                except Exception as exc:  # a bug must not fail the other claims of the call
                    log.exception("preparing ResourceClaim %s (%s) failed", ref, ref.uid)
                    results[ref.uid] = PrepareResult(error=f"internal error: {exc}")
            changed = self.prepared.keys() != before
        if changed:
            self._on_change()
        return results

    async def unprepare(self, refs: Sequence[ClaimRef]) -> dict[str, str]:
        """Unprepare each claim; the error of each by UID ("" when it went well)."""
        results: dict[str, str] = {}
        changed = False
        async with self._lock:
            for ref in refs:
                known = self._checkpoint.update(functools.partial(_take, uid=ref.uid))
                try:
                    await self._unprepare(ref, known)
                    results[ref.uid] = ""
                    changed = changed or known is not None
                    continue
                except NvmlError as exc:
                    results[ref.uid] = f"destroying the MIG instance of {ref}: {exc}"
                except OSError as exc:
                    results[ref.uid] = f"removing the CDI spec of {ref}: {exc}"
                log.warning(
                    "cannot unprepare ResourceClaim %s (%s): %s", ref, ref.uid, results[ref.uid]
                )
                if known is not None:  # still prepared: the kubelet asks again
                    self._checkpoint.update(functools.partial(_put, claim=known))
        if changed:
            self._on_change()
        return results

    async def _unprepare(self, ref: ClaimRef, known: PreparedClaim | None) -> None:
        """Undo what preparing `ref` did; `known` is its entry this call took out of the
        checkpoint (None: not prepared, or another instance took it out)."""
        if known is not None:
            await self._instances.release(known.published, str(ref))
        self._specs.remove(known.spec_file if known else spec_file_name(self.driver, ref.uid))
        if known is not None:
            log.info("unprepared ResourceClaim %s (%s)", ref, ref.uid)

    async def _prepare(self, ref: ClaimRef) -> tuple[PreparedDevice, ...]:
        known = self.prepared.get(ref.uid)
        if known is not None:
            return known.devices
        claim = await self._claims.read(ref)
        if claim.ref.uid != ref.uid:
            raise AllocationError(
                f"ResourceClaim {ref} has UID {claim.ref.uid}, not {ref.uid}: the claim the "
                "kubelet asks for was deleted (and one of the same name created)"
            )
        if claim.devices is None:
            raise AllocationError(f"ResourceClaim {ref} is not allocated")
        ours = [d for d in claim.devices if d.driver == self.driver]
        if not ours:
            drivers = sorted({d.driver for d in claim.devices}) or ["none"]
            raise AllocationError(
                f"ResourceClaim {ref} has no device of driver {self.driver} (its devices are "
                f"of {', '.join(drivers)})"
            )
        elsewhere = sorted({d.pool for d in ours if d.pool != self.pool})
        if elsewhere:
            raise AllocationError(
                f"ResourceClaim {ref} is allocated devices of pool {', '.join(elsewhere)}, but "
                f"this is node {self.pool}: the claim belongs to another node"
            )
        state = self._state()
        if state is None:
            raise AllocationError("no config applied yet: this node has no devices to prepare")
        # One answer per device and share (a claim may hold two shares of one device), with
        # the memory the share consumed and its request asked; one CDI device per device,
        # given what the claim consumes of it in all.
        shares: dict[tuple[str, str | None], _Share] = {}
        consumed: dict[str, int] = {}
        for result in ours:
            share = shares.setdefault((result.device, result.share_id), _Share())
            memory = share.add(result)
            if memory is not None:
                consumed[result.device] = consumed.get(result.device, 0) + memory
        names = list(dict.fromkeys(n for n, _ in shares))
        made = await self._instances.make(
            state.mig, names, str(ref), tainted=state.taints is not None
        )
        try:
            return self._record(
                ref, state, shares, consumed, {n: m.device for n, m in made.items()}
            )
        except BaseException:
            await self._instances.undo(made)
            raise

    def _record(
        self,
        ref: ClaimRef,
        state: PoolState,
        shares: Mapping[tuple[str, str | None], _Share],
        consumed: Mapping[str, int],
        made: Mapping[str, DraDevice],
    ) -> tuple[PreparedDevice, ...]:
        """The claim's CDI spec written and the claim recorded; `made` holds the devices of
        its dynamic MIG placements, whose instances exist now."""
        names = dict.fromkeys(n for n, _ in shares)
        devices = [made.get(name) or self._device(state, name, ref) for name in names]
        spec = claim_spec(
            driver=self.driver,
            claim_uid=ref.uid,
            devices=devices,
            plan=state.plan,
            flags=state.flags,
            consumed_mib=consumed,
            memory_hook_path=state.memory_hook_path,
        )
        file_name = spec_file_name(self.driver, ref.uid)
        self._specs.write(file_name, spec)
        prepared = PreparedClaim(
            ref=ref,
            devices=tuple(
                PreparedDevice(
                    requests=tuple(share.requests),
                    pool=self.pool,
                    device=name,
                    cdi_ids=(cdi_id(self.driver, ref.uid, name),),
                    share_id=share_id,
                    consumed_mib=share.consumed_mib,
                    asked_mib=share.asked_mib,
                )
                for (name, share_id), share in shares.items()
            ),
            spec_file=file_name,
            published=tuple(_published(state, d) for d in devices),
        )
        self._checkpoint.update(functools.partial(_put, claim=prepared))
        log.info(
            "prepared ResourceClaim %s (%s): %s",
            ref,
            ref.uid,
            ", ".join(d.name for d in devices),
        )
        return prepared.devices

    def _device(self, state: PoolState, name: str, ref: ClaimRef) -> DraDevice:
        device = state.devices.get(name)
        if device is None:
            raise AllocationError(
                f"ResourceClaim {ref}: device {name} is not in this node's pool (the config "
                "no longer has it)"
            )
        if not device.healthy:
            if state.taints is None:
                raise AllocationError(
                    f"ResourceClaim {ref}: device {name} ({device.device.physical}) is unhealthy"
                )
            log.warning(
                "ResourceClaim %s: device %s (%s) is unhealthy; prepared all the same: the "
                "claim was allocated it despite its NoSchedule taint",
                ref,
                name,
                device.device.physical,
            )
        return device


@dataclass(slots=True)
class _Share:
    """The results of a claim for one share of a device (one result but where a device is
    not shared): its requests, the memory they consumed, what they asked (None: nothing)."""

    requests: list[str] = field(default_factory=list)
    consumed_mib: int | None = None
    asked_mib: int | None = None

    def add(self, result: AllocatedDevice) -> int | None:
        """Count `result` in; the memory it consumed (None: no consumed memory given)."""
        self.requests.append(result.request)
        memory = quantity_mib(result.consumed.get("memory", ""))
        if memory is not None:
            self.consumed_mib = (self.consumed_mib or 0) + memory
        asked = quantity_bytes(result.asked.get("memory", ""))
        if asked is not None:  # in whole MiB, rounded up as the scheduler rounds a request
            self.asked_mib = (self.asked_mib or 0) + -(-asked >> 20)
        return memory


def _take(claims: dict[str, PreparedClaim], *, uid: str) -> PreparedClaim | None:
    return claims.pop(uid, None)


def _put(claims: dict[str, PreparedClaim], *, claim: PreparedClaim) -> None:
    claims[claim.ref.uid] = claim


def _published(state: PoolState, device: DraDevice) -> PublishedDevice:
    """What the pool published for a device a claim now holds (a placement as a placement)."""
    placement = state.mig.placement(device.name)
    return placement.published() if placement is not None else device.published()
