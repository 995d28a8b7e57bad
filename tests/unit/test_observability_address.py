"""parse_metrics_address: the --metrics-address / METRICS_ADDRESS value."""

from __future__ import annotations

import pytest

from sharing_plugin.observability import parse_metrics_address


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.0.0.0:9400", ("0.0.0.0", 9400)),
        ("127.0.0.1:0", ("127.0.0.1", 0)),
        ("localhost:9400", ("localhost", 9400)),
        ("node-1.example.com:80", ("node-1.example.com", 80)),
        ("[::1]:9400", ("::1", 9400)),
        ("[::]:9400", ("::", 9400)),
        (":9400", ("", 9400)),
        ("off", None),
        (" OFF ", None),
    ],
)
def test_valid_addresses(text: str, expected: tuple[str, int] | None) -> None:
    assert parse_metrics_address(text) == expected


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("9400", "no port"),
        ("", "no port"),
        ("0.0.0.0", "no port"),
        ("::1:9400", "IPv6 host needs brackets"),
        ("[::1]9400", "missing ']:PORT'"),
        ("[nope]:9400", "not an IPv6 address"),
        ("under_score:1", "not a host name or IP"),
        ("host:70000", "port must be a number 0-65535 (got '70000')"),
        ("host:-1", "port must be a number"),
        ("host:http", "port must be a number"),
        ("host:", "port must be a number"),
    ],
)
def test_invalid_addresses_say_what_is_wrong_and_how_to_fix(text: str, says: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_metrics_address(text)
    message = str(info.value)
    assert says in message
    assert repr(text) in message
    assert "0.0.0.0:9400" in message and "'off'" in message
