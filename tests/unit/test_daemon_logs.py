"""Log lines: UTC timestamps, structured JSON fields, quiet third-party loggers."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator

import pytest

from sharing_plugin.daemon.node import logs


def record(msg: str = "hello %s", *args: object, **extra: object) -> logging.LogRecord:
    rec = logging.LogRecord(
        "sharing_plugin.x", logging.INFO, __file__, 1, msg, args or ("you",), None
    )
    rec.created = 1714564800.123  # 2024-05-01T12:00:00.123Z
    rec.msecs = 123.0
    rec.__dict__.update(extra)
    return rec


def test_text_timestamps_are_utc_iso8601_with_z(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "America/New_York")
    line = logs.TextFormatter().format(record())
    assert line.startswith("2024-05-01T12:00:00.123Z INFO    sharing_plugin.x: hello you")


def test_json_lines_carry_the_extra_fields() -> None:
    rec = record(resource="nvidia.com/gpu", gpu="GPU-1", generation=3, config="small")
    entry = json.loads(logs.JsonFormatter().format(rec))
    assert entry == {
        "ts": "2024-05-01T12:00:00.123Z",
        "level": "info",
        "logger": "sharing_plugin.x",
        "msg": "hello you",
        "resource": "nvidia.com/gpu",
        "gpu": "GPU-1",
        "generation": 3,
        "config": "small",
    }
    plain = json.loads(logs.JsonFormatter().format(record()))
    assert set(plain) == {"ts", "level", "logger", "msg"}


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    levels = {n: logging.getLogger(n).level for n in logs.QUIET_LOGGERS}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, old in levels.items():
        logging.getLogger(name).setLevel(old)


@pytest.mark.usefixtures("restore_logging")
def test_third_party_info_is_quiet_but_warnings_show(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("text", level=logging.INFO)
    for name in ("grpc", "asyncio", "httpx2", "httpcore", "asyncinotify", "watchfiles.main"):
        logging.getLogger(name).info("%s chatter", name)
    logging.getLogger("httpx2").warning("a real problem")
    logging.getLogger("sharing_plugin.daemon.run.app").info("ours")
    err = capsys.readouterr().err
    assert "chatter" not in err
    assert "a real problem" in err and "ours" in err
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ", err)


@pytest.mark.usefixtures("restore_logging")
def test_at_debug_third_party_loggers_speak(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("json", level=logging.DEBUG)
    logging.getLogger("httpx2").debug("request sent")
    assert json.loads(capsys.readouterr().err)["msg"] == "request sent"
