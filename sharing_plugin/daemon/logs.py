"""Log output for the daemon: one line per event that matters, as text or as JSON."""

from __future__ import annotations

import json
import logging
import sys
import time

LOG_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def parse_log_level(text: str) -> int:
    """`--log-level` / `LOG_LEVEL` (any case) as a logging level; ValueError for anything else."""
    level = LOG_LEVELS.get(text.strip().lower())
    if level is None:
        raise ValueError(f"--log-level must be debug, info, warning or error (got {text!r})")
    return level


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg (and exc when there is one)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure(log_format: str, *, level: int = logging.INFO) -> None:
    """Send the plugin's logs to stderr in `log_format` (text | json)."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # grpc's own loggers are chatty at INFO about connectivity; their warnings still show.
    logging.getLogger("grpc").setLevel(logging.WARNING)
