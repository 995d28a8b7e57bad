"""`demo`: the plugin on a simulated node with the in-package kubelet simulator."""

from __future__ import annotations

import argparse
import logging

from sharing_plugin.cli.common import EXIT_OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = sub.add_parser("demo", help="the plugin on a simulated node with a simulated kubelet")
    demo.add_argument("--once", action="store_true", help="print, admit one pod, and exit")
    demo.set_defaults(func=_cmd_demo)


def _cmd_demo(args: argparse.Namespace) -> int:
    import asyncio
    import signal

    from sharing_plugin.daemon.logs import configure as configure_logging
    from sharing_plugin.sim.demo import run_demo

    configure_logging("text", level=logging.WARNING)
    # The simulated kubelet warns, as kubelet does, when our stream ends at shutdown: expected.
    logging.getLogger("sharing_plugin.sim.kubelet.endpoint").setLevel(logging.ERROR)
    # The demo prints rejected configs itself.
    logging.getLogger("sharing_plugin.daemon.app").setLevel(logging.CRITICAL)

    async def demo() -> int:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        loop.add_signal_handler(signal.SIGINT, task.cancel)
        loop.add_signal_handler(signal.SIGTERM, task.cancel)
        return await run_demo(once=args.once, say=lambda line: print(line, flush=True))

    try:
        return asyncio.run(demo())
    except asyncio.CancelledError:
        print("stopped.")
        return EXIT_OK
