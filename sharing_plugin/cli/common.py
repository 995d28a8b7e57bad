"""What every command shares: exit codes, on/off flags, flags that also read env vars, and the
flags of the config sources that `run`, `run-dra` and `mps-control` all take."""

from __future__ import annotations

import argparse
import gc
import logging
import os
import re
import sys
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, Self, TypeVar

from sharing_plugin.config.names import DEFAULT_CONFIG_LABEL

if TYPE_CHECKING:
    import asyncio

    from sharing_plugin.daemon.node.options import SourceOptions

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_USAGE = 2
STDIN = "-"

Flag = tuple[str, str, str | None, str]
"""(flag, env var, default, help): a flag that also reads an env var, as the DaemonSet sets it."""


DEFAULT_DRIVER = "gpu.sharing-plugin.io"  # views.dra_api.DEFAULT_DRIVER, without importing it
DRIVER_FLAG: Flag = (
    "--driver-name",
    "DRIVER_NAME",
    DEFAULT_DRIVER,
    "DRA driver name (a DNS subdomain)",
)
# ResourceSlice.spec.driver: a DNS subdomain of at most 63 characters.
_DRIVER = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def driver_name(args: argparse.Namespace) -> str:
    """`--driver-name`, checked as the API server checks a ResourceSlice's driver."""
    driver: str = args.driver_name
    if len(driver) > 63 or not _DRIVER.fullmatch(driver):
        raise ValueError(
            f"--driver-name must be a lower-case DNS subdomain of at most 63 characters "
            f"(got {driver!r})"
        )
    return driver


# Where the config comes from, which GPUs, and this node: the serving commands' `SourceOptions`.
SOURCE_FLAGS: tuple[Flag, ...] = (
    ("--config", "CONFIG_FILE", None, "config file, or a mounted ConfigMap directory"),
    ("--config-name", "CONFIG_NAME", None, "named config to use when the node has no label"),
    ("--config-map", "CONFIG_MAP", None, "NAMESPACE/NAME: read the ConfigMap through the API"),
    ("--config-label", "CONFIG_LABEL", DEFAULT_CONFIG_LABEL, "node label naming the config"),
    ("--gpus", "GPUS", "nvml", "nvml, simulated:PRESET or simulated:PATH"),
    ("--kubelet-dir", "KUBELET_DIR", "/var/lib/kubelet", "kubelet's state directory"),
    ("--node-name", "NODE_NAME", None, "this node, to follow its config label"),
)
METRICS_FLAGS: tuple[Flag, ...] = (
    ("--metrics-address", "METRICS_ADDRESS", "0.0.0.0:9400", "HOST:PORT for metrics, or off"),
)
CDI_DIR_FLAG: Flag = (
    "--cdi-dir",
    "CDI_DIR",
    "/var/run/cdi",
    "directory the container runtime reads CDI specs from",
)
LOG_FLAGS: tuple[Flag, ...] = (
    ("--log-format", "LOG_FORMAT", "text", "text or json"),
    ("--log-level", "LOG_LEVEL", "info", "debug, info, warning or error"),
)


def source_options(args: argparse.Namespace) -> SourceOptions:
    """The config sources, GPUs and node of a serving command; ValueError for a bad value."""
    from sharing_plugin.daemon.node.options import SourceOptions

    config_map = None
    if args.config_map:
        from sharing_plugin.sources.apiconfig import parse_config_map_ref

        config_map = parse_config_map_ref(args.config_map)
    return SourceOptions(
        config_path=Path(args.config) if args.config else None,
        config_name=args.config_name or None,
        config_map=config_map,
        config_label=args.config_label,
        gpus=args.gpus,
        kubelet_dir=Path(args.kubelet_dir),
        node_name=args.node_name or None,
    )


def check_log_flags(args: argparse.Namespace) -> None:
    """ValueError for a `--log-format` or `--log-level` that does not exist."""
    from sharing_plugin.daemon.node.logs import parse_log_level

    if args.log_format not in ("text", "json"):
        raise ValueError(f"--log-format must be text or json (got {args.log_format!r})")
    parse_log_level(args.log_level)


def add_env_flags(parser: argparse.ArgumentParser, flags: Sequence[Flag]) -> None:
    for flag, env, default, text in flags:
        parser.add_argument(
            flag,
            default=os.environ.get(env, default),
            metavar=flag.removeprefix("--").upper().replace("-", "_"),
            help=f"{text} (env {env}{'' if default is None else f'; default {default}'})",
        )


def on_off(flag: str, value: str) -> bool:
    word = value.strip().lower()
    if word in ("on", "true", "1", "yes"):
        return True
    if word in ("off", "false", "0", "no"):
        return False
    raise ValueError(f"{flag} must be on or off (got {value!r})")


class SignalledService(Protocol):
    """A long-running command's service: stopped by SIGTERM/SIGINT, reloaded by SIGHUP."""

    def request_stop(self) -> None: ...

    def request_reload(self) -> None: ...

    async def wait_stopped(self) -> None: ...

    def held_up(self) -> Collection[asyncio.Task[Any]]: ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


def serve_until_stopped(
    build: Callable[[], SignalledService], *, logger: logging.Logger, stopping: str
) -> None:
    """Run the service `build()` makes until a signal stops it; errors propagate.

    The handlers are installed before the service starts, so a signal that arrives during
    start-up stops it gracefully too, once start-up has finished. asyncio is imported here, not
    at the top, so that commands that never serve (`validate`, `plan`) do not load it.
    """
    import asyncio
    import signal

    async def serve() -> None:
        service = build()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, service.request_stop)
        loop.add_signal_handler(signal.SIGINT, service.request_stop)
        loop.add_signal_handler(signal.SIGHUP, service.request_reload)
        try:
            async with service:
                await service.wait_stopped()
                logger.info(stopping)
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(sig)
        await _exit_past_held_up_work(service.held_up(), logger)

    asyncio.run(serve())


# How long work the service left behind may take to end by itself once it has stopped.
EXIT_BOUND_S = 1.0


async def _exit_past_held_up_work(
    held_up: Collection[asyncio.Task[Any]], logger: logging.Logger
) -> None:
    """Once the service has stopped: let what it says a peer holds up (`Service.held_up`) end by
    itself, within EXIT_BOUND_S; what has not by then is left behind by ending the process here.

    That is a grpc server's shutdown that a client which does not read holds up (a frozen
    process with a stream open: see kubelet.listener's `Listener.close`). asyncio.run would
    cancel it on the way out, and grpc's cancellation waits for that client in a thread join
    that nothing ends: the pod would stay Terminating until kubelet killed it.
    """
    import asyncio

    left = {task for task in held_up if not task.done()}
    if not left:
        return
    _, pending = await asyncio.wait(left, timeout=EXIT_BOUND_S)
    if not pending:
        return
    logger.warning(
        "exiting with %d task(s) of a stopped server unfinished after %.1f s (%s): a client "
        "that does not read holds them",
        len(pending),
        EXIT_BOUND_S,
        ", ".join(sorted(task.get_name() for task in pending)),
    )
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_OK)


Options = TypeVar("Options")


def serve_command(
    args: argparse.Namespace,
    *,
    command: str,
    options: Callable[[argparse.Namespace], Options],
    service: Callable[[Options], SignalledService],
    logger: logging.Logger,
    check: Callable[[Options], None] = lambda _: None,
    stopping: str = "stopping",
) -> int:
    """A serving command from its arguments to its exit code: options (a bad value is a usage
    error, exit 2), logging, `check` (paths the service could never use), then the service
    until a signal stops it; a `SharingPluginError` that ends it is logged and exits 1."""
    from sharing_plugin.daemon.node.logs import configure as configure_logging
    from sharing_plugin.daemon.node.logs import parse_log_level
    from sharing_plugin.errors import SharingPluginError

    # Start-up makes ~90,000 objects that live as long as the process (modules, classes, the
    # config schema) and almost no cyclic garbage; collecting while they are made was a tenth
    # of the start (issue 29). So the collector waits until the service is built (its imports
    # done), then skips them for good (frozen) and runs as usual on what comes after.
    gc.disable()
    try:
        check_log_flags(args)
        resolved = options(args)
    except ValueError as exc:
        gc.enable()
        print(f"sharing-plugin {command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    configure_logging(args.log_format, level=parse_log_level(args.log_level))

    def build() -> SignalledService:
        try:
            return service(resolved)
        finally:
            gc.freeze()
            gc.enable()

    try:
        check(resolved)
        serve_until_stopped(build, logger=logger, stopping=stopping)
    except SharingPluginError as exc:
        logger.error("cannot run: %s", exc)
        return EXIT_INVALID
    finally:
        gc.enable()
    return EXIT_OK
