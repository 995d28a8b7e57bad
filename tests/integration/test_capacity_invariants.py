"""Capacity never lies, under a generated schedule of events (issue 16).

A Hypothesis state machine drives the real daemon against the kubelet simulator, over real unix
sockets, in an event loop the machine owns (Hypothesis' stateful rules are synchronous): pods are
admitted and deleted, the config is reloaded up and down, renamed, broken, GPUs get Xids, kubelet
restarts, the plugin restarts (its config changed meanwhile, a killed run's socket left behind),
and pods are admitted inside the two windows a reload opens (while PodResources answers, and
between kubelet's pick and Allocate). After every step, once kubelet and the plugin agree:

1. every device a pod holds is advertised, Healthy or draining, until released;
2. no device is held twice, so no physical device has more holders than replicas advertised;
3. what is advertised is the last good config's devices (health applied) plus draining ones,
   each Unhealthy and held by a pod or granted a moment ago; /status and metrics say the same;
4. an admission fails only for want of free devices, never because the plugin refused it (or,
   when kubelet picked devices of a resource that a rename then removed, as kubelet fails it
   for a stopped endpoint);
5. the device-plugin directory holds no socket of ours but the live ones.

At the end every pod is deleted and the node must advertise exactly the last good config.

The suite runs a small, fixed (derandomized) sample; `INVARIANT_EXAMPLES=200 INVARIANT_STEPS=30`
explores new schedules for as long as one is willing to wait.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import shutil
import socket
import tempfile
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from daemon_harness import append_fault, eventually, node_file, run_options
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from support.observe import health_monitor, resource_names, unconfirmed_grants

from sharing_plugin.backends import backend_from_spec
from sharing_plugin.daemon.run.app import NodeDevicePlugin
from sharing_plugin.nvml.discover import discover
from sharing_plugin.sim.kubelet.simulator import AdmissionError, KubeletSimulator

T = TypeVar("T")
log = logging.getLogger(__name__)
GPU = "nvidia.com/gpu"
SHARED = "nvidia.com/gpu.shared"
GPUS = 3
NODE = {
    "name": "invariants",
    "gpus": [{"product": "NVIDIA A100-SXM4-80GB", "count": GPUS, "numaNode": 0}],
    "faults": [],
}
EXAMPLES = int(os.environ.get("INVARIANT_EXAMPLES", "12"))
STEPS = int(os.environ.get("INVARIANT_STEPS", "8"))
STEP_TIMEOUT_S = 10.0
UPDATE_S = 2.0
SETTLE_S = 5.0
BROKEN = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - {name: gpu, replicas: 0}\n"

replicas_st = st.integers(1, 4)  # 1: no sharing (whole GPUs)
count_st = st.integers(1, 3)


def config_text(replicas: int, rename: bool) -> str:
    if replicas == 1:
        return "version: v1\n"
    return (
        "version: v1\nsharing:\n  timeSlicing:\n"
        f"    renameByDefault: {'true' if rename else 'false'}\n"
        f"    resources:\n      - name: nvidia.com/gpu\n        replicas: {replicas}\n"
    )


def write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


class CapacityMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.root = Path(tempfile.mkdtemp(prefix="k", dir="/tmp"))
        self.node = node_file(self.root, NODE)
        self.gpus = f"simulated:{self.node}"
        self.uuids = [g.uuid for g in discover(backend_from_spec(self.gpus)).gpus]
        self.config = self.root / "config.yaml"
        self.good = (2, False)
        self.written = config_text(*self.good)
        write(self.config, self.written)
        self.broken = False
        self.counter = 0
        self.failed = False
        self.kubelet: KubeletSimulator | None = None
        self.daemon: NodeDevicePlugin | None = None
        self.run(self._start())

    # -- plumbing ------------------------------------------------------------------------------

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            return self.loop.run_until_complete(asyncio.wait_for(coro, STEP_TIMEOUT_S))
        except BaseException:
            self.failed = True
            raise

    async def _start(self) -> None:
        self.kubelet = KubeletSimulator(self.root, grace_period=0.2, dial_timeout=2.0)
        await self.kubelet.start()
        await self._start_plugin()

    async def _start_plugin(self) -> None:
        options = run_options(
            config_path=self.config, gpus=self.gpus, kubelet_dir=self.root, drain_recheck_s=0.05
        )
        self.daemon = NodeDevicePlugin(options, nvml=backend_from_spec(self.gpus))
        await self.daemon.start()
        await self._settle()

    @property
    def k(self) -> KubeletSimulator:
        assert self.kubelet is not None
        return self.kubelet

    @property
    def d(self) -> NodeDevicePlugin:
        assert self.daemon is not None
        return self.daemon

    def resource(self) -> str:
        replicas, rename = self.good
        return SHARED if replicas > 1 and rename else GPU

    async def _write_and_wait(self, text: str) -> None:
        if text == self.written:
            return  # the source reports changes only: nothing would come
        self.written = text
        with self.d.pipeline.outcomes() as outcomes:  # subscribed before the write is seen
            write(self.config, text)
            try:
                await outcomes.next(UPDATE_S)
            except TimeoutError:
                # The file watch missed the write (a lost inotify event, not what this test
                # is about): SIGHUP makes the daemon read the file again.
                log.warning(
                    "config write not seen within %.1f s: reloading as SIGHUP does", UPDATE_S
                )
                self.d.request_reload()
                await outcomes.next()

    async def _reload(self, replicas: int, rename: bool) -> None:
        await self._write_and_wait(config_text(replicas, rename))
        self.good, self.broken = (replicas, rename), False

    async def _admit(self, count: int) -> None:
        self.counter += 1
        try:
            await self.k.admit_pod(f"p{self.counter}", containers={"c": {self.resource(): count}})
        except AdmissionError as exc:
            self._check_refusal(exc)

    @staticmethod
    def _check_refusal(exc: AdmissionError) -> None:
        message = str(exc)
        assert (
            "requested number of devices unavailable" in message
            or "cannot allocate unregistered device" in message
            or "has been stopped" in message
        ), f"the plugin failed an admission: {message}"

    async def _settle(self) -> None:
        try:
            await eventually(lambda: not self.violations(), within=SETTLE_S)
        except TimeoutError:
            raise AssertionError(f"not settled: {self.violations()}") from None

    # -- the invariants ------------------------------------------------------------------------

    def disagreements(self) -> list[str]:
        """Kubelet sees exactly what the supervisor advertises; removed resources, nothing."""
        k, advertised = self.k, self.d.supervisor.advertised
        if advertised is None:
            return ["nothing advertised"]
        problems = [
            f"kubelet's view of {r.name} differs from what is advertised"
            for r in advertised.resources
            if k.devices(r.name) != {x.id: x.health.value for x in r.devices}
        ]
        problems += [
            f"{name} is not advertised but kubelet counts {k.capacity(name)}"
            for name in k.resources()
            if advertised.resource(name) is None and k.capacity(name)
        ]
        return problems

    def violations(self) -> list[str]:
        k, d = self.k, self.d
        problems = self.disagreements()
        advertised = d.supervisor.advertised
        if advertised is None:
            return problems
        # 1 and 2: holds are advertised, and unique.
        held: dict[str, set[str]] = {}
        for pod in k.pods.values():
            for a in pod.allocations:
                ids = held.setdefault(a.resource, set())
                if ids & set(a.device_ids):
                    problems.append(f"{sorted(ids & set(a.device_ids))} held twice")
                ids.update(a.device_ids)
                missing = set(a.device_ids) - set(k.devices(a.resource))
                if missing:
                    problems.append(f"{pod.name} holds {sorted(missing)}, not advertised")
        # 3: the last good config plus draining.
        replicas, _ = self.good
        name = self.resource()
        health = d.pipeline.health
        expected = {
            (uuid if replicas == 1 else f"{uuid}::{n}"): health.get(uuid, True)
            for uuid in self.uuids
            for n in range(replicas)
        }
        granted = unconfirmed_grants(d.supervisor)
        status = d.status.to_json()
        metrics = d.metrics.render().decode()
        for r in advertised.resources:
            devices = {x.id: x.healthy for x in r.devices}
            base = expected if r.name == name else {}
            wrong = {i for i, ok in base.items() if devices.get(i) != ok}
            if wrong:
                problems.append(f"{r.name}: {sorted(wrong)[:3]} not advertised as planned")
            draining = set(devices) - set(base)
            if any(devices[i] for i in draining):
                problems.append(f"{r.name}: a draining device is advertised Healthy")
            unheld = draining - held.get(r.name, set()) - granted.get(r.name, frozenset())
            if unheld:
                problems.append(f"{r.name}: {sorted(unheld)[:3]} drain but nobody holds them")
            shown = status["resources"].get(r.name, {})
            if set(shown.get("draining", ())) != draining or shown.get("devices") != len(devices):
                problems.append(f"{r.name}: /status says {shown}")
            gauge = f'sharing_plugin_draining_devices{{resource="{r.name}"}} {len(draining)}.0'
            if gauge not in metrics:
                problems.append(f"{r.name}: draining gauge is not {len(draining)}")
        if advertised.resource(name) is None:
            problems.append(f"{name} is not advertised")
        if (status["lastError"] is not None) != self.broken:
            problems.append(f"lastError is {status['lastError']!r} (broken edit: {self.broken})")
        # 5: no socket of ours but the live ones.
        ours, live = set(k.plugin_dir.glob("sharing-*.sock")), set(d.supervisor.own_sockets())
        if ours != live:
            names = sorted(p.name for p in ours), sorted(p.name for p in live)
            problems.append("sockets {} are not the live ones {}".format(*names))
        return problems

    @invariant()
    def capacity_never_lies(self) -> None:
        assert not self.violations(), self.violations()

    # -- the events ----------------------------------------------------------------------------

    @rule(replicas=replicas_st, rename=st.booleans())
    def reload(self, replicas: int, rename: bool) -> None:
        async def step() -> None:
            await self._reload(replicas, rename)
            await self._settle()

        self.run(step())

    @rule()
    def broken_edit(self) -> None:
        async def step() -> None:
            await self._write_and_wait(BROKEN)
            self.broken = True
            await self._settle()

        self.run(step())

    @rule(count=count_st)
    def admit(self, count: int) -> None:
        async def step() -> None:
            await self._admit(count)
            await self._settle()

        self.run(step())

    @precondition(lambda self: bool(self.kubelet and self.kubelet.pods))
    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        namespace, name = data.draw(st.sampled_from(sorted(self.k.pods)), label="pod")
        self.k.delete_pod(name, namespace)
        self.run(self._settle())

    @rule(gpu=st.integers(0, GPUS - 1))
    def xid(self, gpu: int) -> None:
        async def step() -> None:
            monitor = health_monitor(self.d.pipeline)
            assert monitor is not None
            await asyncio.wait_for(monitor.watching.wait(), 2.0)
            if self.d.pipeline.health.get(self.uuids[gpu], True):
                append_fault(self.node, {"gpu": gpu, "xid": 79})
                await eventually(lambda: self.d.pipeline.health.get(self.uuids[gpu]) is False, 2.0)
            await self._settle()

        self.run(step())

    @rule()
    def kubelet_restart(self) -> None:
        async def step() -> None:
            registrations = len(self.k.events)
            await self.k.restart()
            await eventually(lambda: len(self.k.registrations) >= 1, 3.0)
            assert len(self.k.events) > registrations
            await self._settle()

        self.run(step())

    @rule(replicas=replicas_st, rename=st.booleans(), stale=st.booleans())
    def plugin_restart(self, replicas: int, rename: bool, stale: bool) -> None:
        """The plugin stops; the config changes meanwhile; maybe a killed run's socket stays."""

        async def step() -> None:
            await self.d.close()
            self.daemon = None
            self.written = config_text(replicas, rename)
            write(self.config, self.written)
            self.good, self.broken = (replicas, rename), False
            if stale:
                path = self.k.plugin_dir / f"sharing-nvidia.com-gpu-{secrets.token_hex(4)}.sock"
                with socket.socket(socket.AF_UNIX) as dead:
                    dead.bind(str(path))
            await self._start_plugin()

        self.run(step())

    @rule(replicas=replicas_st, rename=st.booleans(), count=count_st)
    def admit_while_pod_resources_answers(self, replicas: int, rename: bool, count: int) -> None:
        """Defect 1's window: the reload has kubelet's answer on its way, Allocate still serves
        the old snapshot."""

        async def step() -> None:
            gate = self.k.pod_resources_hold
            gate.close()
            try:
                reload = asyncio.ensure_future(self._reload(replicas, rename))
                await eventually(lambda: gate.waiting > 0 or reload.done(), 3.0)
                await self._admit(count)
            finally:
                gate.open()
            await reload
            await self._settle()

        self.run(step())

    @rule(replicas=replicas_st, rename=st.booleans(), count=count_st)
    def admit_across_a_reload(self, replicas: int, rename: bool, count: int) -> None:
        """Defect 2's window: kubelet picked devices, then the reload withdrew them, then
        Allocate arrives."""

        async def step() -> None:
            gate = self.k.allocate_hold
            gate.close()
            try:
                admission = asyncio.ensure_future(self._admit(count))
                await eventually(lambda: gate.waiting > 0 or admission.done(), 3.0)
                await self._reload(replicas, rename)
                await eventually(lambda: not self.disagreements(), 3.0)
            finally:
                gate.open()
            await admission
            await self._settle()

        self.run(step())

    # -- the end -------------------------------------------------------------------------------

    def teardown(self) -> None:
        try:
            if not self.failed and self.daemon is not None:
                self.run(self._final_state())
        finally:
            self.loop.run_until_complete(self._stop())
            left = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()
            shutil.rmtree(self.root, ignore_errors=True)
            assert not left, f"tasks left running: {[t.get_name() for t in left]}"

    async def _final_state(self) -> None:
        if self.broken:
            await self._reload(*self.good)
        for namespace, name in list(self.k.pods):
            self.k.delete_pod(name, namespace)

        def only_the_config() -> bool:
            advertised = self.d.supervisor.advertised
            return (
                not self.violations()
                and advertised is not None
                and resource_names(advertised) == (self.resource(),)
                and len(advertised.resources[0].devices) == GPUS * self.good[0]
            )

        try:
            # A device granted just before a reload dropped it may drain up to the grants'
            # window (2 s) when kubelet never shows its pod: the pod was deleted at once.
            await eventually(only_the_config, within=SETTLE_S)
        except TimeoutError:
            problems = self.violations()
            raise AssertionError(f"final state is not the last good config: {problems}") from None
        assert self.k.allocatable(self.resource()) == sum(
            self.good[0] for uuid in self.uuids if self.d.pipeline.health.get(uuid, True)
        )

    async def _stop(self) -> None:
        if self.daemon is not None:
            await self.daemon.close()
        if self.kubelet is not None:
            await self.kubelet.stop()


CapacityMachine.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=STEPS,
    deadline=None,
    derandomize="INVARIANT_EXAMPLES" not in os.environ,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_capacity_never_lies = CapacityMachine.TestCase
