"""The command line in the test process: `main(ARGS)` with stdout and stderr captured, as a
child process would print them, and its exit code.

Much cheaper than a child (the package is imported already), so checks of output lines and exit
codes use it; a child stays where the process itself is the point (`sys.exit`, the real stdin,
signals, a serving `run`). `run` sees none of the environment variables it reads unless `env`
gives them, as `plugin_process.child_env` does for a child.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
from collections.abc import Iterator, Mapping

from sharing_plugin.cli import main

# Every variable `run` reads, so the test process's environment cannot leak into a test.
RUN_ENV_VARS = (
    "CONFIG_FILE",
    "CONFIG_NAME",
    "GPUS",
    "KUBELET_DIR",
    "CDI_DIR",
    "NODE_NAME",
    "METRICS_ADDRESS",
    "LOG_FORMAT",
    "LOG_LEVEL",
    "CONFIG_LABEL",
    "CONFIG_MAP",
    "NODE_STATUS",
    "CLEAR_LABELS_ON_EXIT",
    "LABELS_FILE",
    "NODE_LABELS",
    "PROC_ROOT",
    "CDI_DIR",
    "NVIDIA_CDI_HOOK_PATH",
    "NVIDIA_DRIVER_ROOT",
    "KUBECONFIG",
    "DP_DISABLE_HEALTHCHECKS",
    "DP_ENABLE_HEALTHCHECKS",
)


def cli(*args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the command line here; what it printed and its exit code.

    A command may configure logging (`demo` quiets loggers, `run` installs its handler) as it
    would in its own process: that configuration is undone afterwards, so no later test runs
    with it."""
    out, err = io.StringIO(), io.StringIO()
    loggers = logging.Logger.manager.loggerDict
    levels = {name: lg.level for name, lg in loggers.items() if isinstance(lg, logging.Logger)}
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        with (
            _environment(env or {}),
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
        ):
            code = main(list(args))
    finally:
        root.handlers[:], root.level = handlers, level
        for name, logger in list(loggers.items()):
            if isinstance(logger, logging.Logger):
                logger.setLevel(levels.get(name, logging.NOTSET))
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    saved = {name: os.environ.pop(name) for name in RUN_ENV_VARS if name in os.environ}
    os.environ.update(env)
    try:
        yield
    finally:
        for name in env:
            os.environ.pop(name, None)
        os.environ.update(saved)
