"""Log output for the daemon: one line per event that matters, as text or as JSON.

Timestamps are UTC in ISO 8601 with a `Z` in both formats. JSON lines carry, besides ts, level,
logger and msg, every field a call passes with `extra=` (e.g. ``resource``, ``gpu``,
``generation``, ``config``). Libraries the plugin uses (grpc, asyncio, the HTTP clients under
lightkube, asyncinotify) log at WARNING and above only, unless the level is debug.
"""

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


#: Third-party loggers that say at INFO what the plugin's own lines already say (or nothing of
#: use): connectivity changes, every HTTP request to the API server, inotify details.
QUIET_LOGGERS = (
    "grpc",
    "asyncio",
    "httpx",
    "httpx2",
    "httpcore",
    "httpcore2",
    "h2",
    "hpack",
    "lightkube",
    "asyncinotify",
    "watchfiles",
    "urllib3",
)

# What every LogRecord has; anything else on a record came from `extra=`.
_STANDARD = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys()
    | {"message", "asctime", "taskName"}
)


def utc_timestamp(record: logging.LogRecord) -> str:
    """`2024-05-01T12:00:00.123Z`: the record's time in UTC, millisecond precision."""
    return (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        + f".{int(record.msecs):03d}Z"
    )


def extra_fields(record: logging.LogRecord) -> dict[str, object]:
    """The fields a logging call passed with `extra=`."""
    return {
        k: v for k, v in record.__dict__.items() if k not in _STANDARD and not k.startswith("_")
    }


class TextFormatter(logging.Formatter):
    """`<UTC ts> <LEVEL> <logger>: <msg>`."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return utc_timestamp(record)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, the `extra=` fields (and exc)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": utc_timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in extra_fields(record).items():
            entry.setdefault(key, value)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure(log_format: str, *, level: int = logging.INFO) -> None:
    """Send the plugin's logs to stderr in `log_format` (text | json)."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # Their warnings still show; at debug everything does.
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(
            logging.WARNING if level > logging.DEBUG else logging.NOTSET
        )
