"""Benchmark: reload latency of the config sources (the part before planning and kubelet).

1. ConfigMap swap: a directory laid out as kubelet's AtomicWriter does it; each round writes a
   new timestamped directory and renames `..data_tmp` over `..data`. Measured from just before
   that rename to `ConfigSource.updates()` yielding the new config (validated, selected).
2. Node label: a label change on the fake Node API server (real HTTP over TCP, same process)
   -> `NodeLabelWatcher` reports it -> `ConfigSource.trigger` -> the update with the newly
   selected config is yielded. Measured from the server-side change to the yield.
3. ConfigMap edit on a real kube-apiserver (`../shared/tools/realapi.gz`, Kubernetes 1.36 with
   etcd and its watch cache; started here, ~3 s): the daemon in-process with `--config-map`
   (the test harness's `running()`), the kubelet simulator, and a PATCH of the ConfigMap's
   data by an admin client. Measured from just before the PATCH is sent to the kubelet
   simulator holding the new device list, over `--real-api-rounds` edits (replicas 4 <-> 5).
   The whole reload, not a leg: goal p50 <= 200 ms, p99 <= 1 s. Without the tools the figure
   says it was not measured.

Also prints the CPU used by this process while one ConfigSource watches a directory in which
nothing changes (the watch waits on inotify through the event loop: it should be ~0).

Run from the repository root: `.venv/bin/python bench/bench_reload.py` (`--quick` for a short
run, `--json PATH` to also write the figures for `make bench`). Goals for the whole reload
(this leg plus planning and the kubelet-visible leg): p50 <= 150 ms, p99 <= 400 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "integration"))
sys.path.insert(0, str(ROOT / "tests"))

import realapi  # noqa: E402
from daemon_harness import running  # noqa: E402
from figures import FigureLog, add_json_option, ms, p50_p99  # noqa: E402
from k8s_fake import ConfigMapVolume  # noqa: E402
from kube_api import FakeKubeApi  # noqa: E402
from lightkube.models.meta_v1 import ObjectMeta  # noqa: E402
from lightkube.resources.core_v1 import ConfigMap, Namespace, Node  # noqa: E402
from lightkube.types import PatchType  # noqa: E402

from sharing_plugin.config.names import DEFAULT_CONFIG_LABEL as DEFAULT_LABEL  # noqa: E402
from sharing_plugin.sources.filewatch import ConfigSource  # noqa: E402
from sharing_plugin.sources.kube import client_from_kubeconfig  # noqa: E402
from sharing_plugin.sources.nodelabel import NodeLabelWatcher  # noqa: E402
from sharing_plugin.sources.update import ConfigUpdate, Trigger  # noqa: E402

NODE = "bench-node"
TEXT = (
    "version: v1\n"
    "sharing:\n"
    "  timeSlicing:\n"
    "    resources:\n"
    "    - name: nvidia.com/gpu\n"
    "      replicas: {}\n"
)


def replicas(update: ConfigUpdate) -> int | None:
    if update.loaded is None or update.loaded.config.sharing.time_slicing is None:
        return None
    return update.loaded.config.sharing.time_slicing.resources[0].replicas


def quantiles(samples: list[float]) -> str:
    p50, p99 = p50_p99(samples)
    return f"n={len(samples)} p50={ms(p50)} p99={ms(p99)} max={ms(max(samples))}"


async def bench_swap(root: Path, rounds: int) -> list[float]:
    volume = ConfigMapVolume(root, {"default": TEXT.format(1), "other": TEXT.format(99)})
    source = ConfigSource(root)
    source.read()
    queue: asyncio.Queue[tuple[float, ConfigUpdate]] = asyncio.Queue()

    async def consume() -> None:
        async for update in source.updates():
            queue.put_nowait((time.perf_counter(), update))

    consumer = asyncio.create_task(consume(), name="bench-consumer")
    await asyncio.sleep(0.2)  # watch in place
    samples = []
    try:
        for n in range(2, rounds + 2):
            volume.update({"default": TEXT.format(n), "other": TEXT.format(99)})
            while True:
                at, update = await asyncio.wait_for(queue.get(), 5)
                if replicas(update) == n:
                    break
            samples.append(at - volume.swapped_at)
            await asyncio.sleep(random.uniform(0.02, 0.06))  # independent swaps
    finally:
        source.stop()
        await consumer
    return samples


async def bench_label(root: Path, rounds: int) -> list[float]:
    ConfigMapVolume(root, {"default": TEXT.format(1), "a": TEXT.format(2), "b": TEXT.format(3)})
    async with FakeKubeApi() as api:
        api.put_node(NODE, {})
        # Outside the ConfigMap's directory: a file in it would be read as one more config key.
        client = client_from_kubeconfig(api.kubeconfig(root.with_name("kubeconfig")))
        watcher = NodeLabelWatcher(NODE, client=client)
        source = ConfigSource(root, label_value=lambda: watcher.value)
        source.read()
        queue: asyncio.Queue[tuple[float, ConfigUpdate]] = asyncio.Queue()

        async def consume() -> None:
            async for update in source.updates():
                queue.put_nowait((time.perf_counter(), update))

        consumer = asyncio.create_task(consume(), name="bench-consumer")
        label_task = asyncio.create_task(
            watcher.run(lambda _: source.trigger(Trigger.LABEL_CHANGED)), name="bench-label"
        )
        await api.wait_watches(1)
        samples = []
        try:
            for n in range(rounds):
                name = "ab"[n % 2]
                started = time.perf_counter()
                api.set_node_label(NODE, DEFAULT_LABEL, name)
                while True:
                    at, update = await asyncio.wait_for(queue.get(), 5)
                    if update.name == name:
                        break
                samples.append(at - started)
                await asyncio.sleep(random.uniform(0.02, 0.06))
        finally:
            label_task.cancel()
            await asyncio.gather(label_task, return_exceptions=True)
            source.stop()
            await consumer
            await client.close()
    return samples


async def bench_real_api(root: Path, rounds: int) -> list[float]:
    """A ConfigMap edit on a real kube-apiserver -> the kubelet simulator holds the new list."""
    namespace, name, node = "bench", "gpu-config", "bench-node"
    gpu = "nvidia.com/gpu"
    with realapi.private(root / "realapi") as api:
        admin = client_from_kubeconfig(api.kubeconfig)
        plugin = client_from_kubeconfig(api.kubeconfig)
        try:
            await admin.create(Namespace(metadata=ObjectMeta(name=namespace)))
            await admin.create(Node(metadata=ObjectMeta(name=node)))
            await admin.create(
                ConfigMap(
                    metadata=ObjectMeta(name=name, namespace=namespace),
                    data={"default": TEXT.format(4)},
                )
            )
            async with running(
                root / "k", None, config_map=(namespace, name), node_name=node, kube_client=plugin
            ) as run:
                samples = []
                # The first edit also waits for the watch to be open; it is not counted.
                for n in range(rounds + 1):
                    replicas = 5 if n % 2 == 0 else 4
                    started = time.perf_counter()
                    await admin.patch(
                        ConfigMap,
                        name,
                        {"data": {"default": TEXT.format(replicas)}},
                        namespace=namespace,
                        patch_type=PatchType.MERGE,
                    )
                    await run.kubelet.wait_for(
                        lambda: run.kubelet.capacity(gpu) == 8 * replicas,  # noqa: B023 -- awaited here
                        timeout=10,
                    )
                    if n:
                        samples.append(time.perf_counter() - started)
                    await asyncio.sleep(random.uniform(0.02, 0.06))  # independent edits
        finally:
            await plugin.close()
            await admin.close()
    return samples


async def idle_cpu(root: Path, seconds: float) -> float:
    ConfigMapVolume(root, {"default": TEXT.format(1)})
    source = ConfigSource(root)
    source.read()

    async def consume() -> None:
        async for _ in source.updates():
            pass

    consumer = asyncio.create_task(consume(), name="bench-idle")
    await asyncio.sleep(0.3)
    before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    await asyncio.sleep(seconds)
    after = resource.getrusage(resource.RUSAGE_SELF)
    elapsed = time.perf_counter() - started
    source.stop()
    await consumer
    used = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return 100 * used / elapsed


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20 rounds each, 1 s idle")
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--idle-s", type=float, default=5.0)
    parser.add_argument("--real-api-rounds", type=int, default=50)
    add_json_option(parser)
    args = parser.parse_args()
    rounds = 20 if args.quick else args.rounds
    log = FigureLog(args.json)
    goal = "- (a leg of the reload below)"
    with tempfile.TemporaryDirectory(prefix="bench-reload-") as tmp:
        base = Path(tmp)
        swap = await bench_swap(base / "swap", rounds)
        print(f"configmap ..data swap -> update yielded: {quantiles(swap)}")
        log.add("config-source leg: ConfigMap `..data` swap -> update yielded", goal, _value(swap))
        label = await bench_label(base / "label", rounds)
        print(f"node label change -> update yielded:     {quantiles(label)}")
        log.add("config-source leg: node label change -> update yielded", goal, _value(label))
        cpu = await idle_cpu(base / "idle", 1.0 if args.quick else args.idle_s)
        print(f"idle CPU of a watching ConfigSource: {cpu:.2f}% of a core")
        figure = "reload, real kube-apiserver: ConfigMap edit -> kubelet holds the new list"
        api_goal = "p50 <= 200 ms, p99 <= 1 s"
        if not realapi.AVAILABLE:
            print(f"real API server: not measured ({realapi.SKIP_REASON})")
            log.add(figure, api_goal, f"not measured: {realapi.SKIP_REASON}")
            return
        real = await bench_real_api(base / "real", 20 if args.quick else args.real_api_rounds)
        print(f"real API ConfigMap edit -> kubelet holds the new list: {quantiles(real)}")
        log.add(figure, api_goal, _value(real))


def _value(samples: list[float]) -> str:
    p50, p99 = p50_p99(samples)
    return f"p50 {ms(p50)}, p99 {ms(p99)} (n={len(samples)})"


if __name__ == "__main__":
    asyncio.run(main())
