"""What the docs say about flags, env vars, defaults and limits is what the code holds.

Each claim that can drift is read out of README.md, docs/contract.md and docs/architecture.md
and compared with the command line's argparse definitions or the constant the code uses, so a
changed default or limit that the docs do not follow (or a doc number edited by hand) fails
here. Whitespace is normalised first: a claim may wrap anywhere in the Markdown source.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from sharing_plugin.cli import _parser
from sharing_plugin.config.base import DEFAULT_IGNORED_XIDS, MAX_DEVICES_PER_RESOURCE
from sharing_plugin.config.options import Flags as ConfigFlags
from sharing_plugin.config.options import Health
from sharing_plugin.config.usage import DEFAULT_OVER_SHARE_SECONDS
from sharing_plugin.config.yamldoc import MAX_BYTES
from sharing_plugin.daemon.node import node_side
from sharing_plugin.daemon.node.discovery import REDISCOVER_MAX_S
from sharing_plugin.daemon.node.options import SourceOptions
from sharing_plugin.daemon.run import usage
from sharing_plugin.daemon.run.options import RunOptions
from sharing_plugin.dra import health as dra_health
from sharing_plugin.kit import unix_grpc
from sharing_plugin.kubelet import server, servicer, stream_watch
from sharing_plugin.kubelet.api.constants import KUBELET_MAX_RECEIVE_MESSAGE_BYTES
from sharing_plugin.mps.watch import STALE_HEARTBEATS
from sharing_plugin.observability import nodestatus
from sharing_plugin.plan.mps import MPS_CLIENTS_NEW, MPS_CLIENTS_OLD
from sharing_plugin.sources import apiconfig, kube
from sharing_plugin.views.dra_api import (
    MAX_COUNTER_SETS_PER_SLICE,
    MAX_DEVICES_PER_SLICE,
    MAX_DEVICES_WITH_TAINTS_OR_COUNTERS,
)

ROOT = Path(__file__).resolve().parents[2]
README, CONTRACT, ARCHITECTURE = "README.md", "docs/contract.md", "docs/architecture.md"
_HELP_ENV = re.compile(r"\(env ([A-Z_]+)(?:; default .*)?\)$")

Flags = dict[str, tuple[str, str | None]]
"""flag -> (env var, default) of one command."""


def _text(doc: str) -> str:
    return " ".join((ROOT / doc).read_text().split())


def _section(doc: str, heading: str) -> str:
    """The text under `heading` (a whole Markdown heading line) up to the next heading of the
    same or a higher level, whitespace normalised."""
    lines = (ROOT / doc).read_text().splitlines()
    start = lines.index(heading)
    level = len(heading) - len(heading.lstrip("#"))
    end = next(
        (
            i
            for i in range(start + 1, len(lines))
            if lines[i].startswith("#") and len(lines[i]) - len(lines[i].lstrip("#")) <= level
        ),
        len(lines),
    )
    return " ".join(" ".join(lines[start + 1 : end]).split())


def _subparsers(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


@pytest.fixture
def flags(monkeypatch: pytest.MonkeyPatch) -> dict[str, Flags]:
    """command -> its flags that also read an env var, as argparse defines them; the env vars
    are cleared first, so each default is the one written in the code."""

    def read() -> dict[str, Flags]:
        commands: dict[str, Flags] = {}
        for command, sub in _subparsers(_parser()):
            for action in sub._actions:
                match = _HELP_ENV.search(action.help or "")
                if match and action.option_strings:
                    flag = action.option_strings[0]
                    commands.setdefault(command, {})[flag] = (match[1], action.default)
        return commands

    for command in read().values():
        for env, _ in command.values():
            monkeypatch.delenv(env, raising=False)
    return read()


def _table(section: str) -> Flags:
    """The `| flag | env | default | ... |` rows of a contract section."""
    rows: Flags = {}
    for row in re.findall(r"\| `(--[a-z-]+)[^`]*` \| `([A-Z_]+)` \| ([^|]+) \|", section):
        flag, env, default = row
        value = re.fullmatch(r"`([^`]+)`", default.strip())
        rows[flag] = (env, value[1] if value else None)
    return rows


def test_contract_run_table_is_every_run_flag(flags: dict[str, Flags]) -> None:
    table = _table(_section(CONTRACT, "### `run [flags]`"))
    assert table == flags["run"]


def test_contract_run_dra_table_and_list_are_every_run_dra_flag(flags: dict[str, Flags]) -> None:
    section = _section(CONTRACT, "### `run-dra [flags]`")
    table = _table(section)
    assert {f: flags["run-dra"][f] for f in table} == table  # required: no default
    listed = re.search(r"every config-source flag of `run` \(([^;]*);", section)
    assert listed is not None
    shared = set(re.findall(r"`(--[a-z-]+)`", listed[1]))
    assert shared | set(table) == set(flags["run-dra"])


def test_contract_mps_control_flags(flags: dict[str, Flags]) -> None:
    section = _section(CONTRACT, "### `mps-control [flags]`")
    listed = re.search(r"except `--metrics-address` \(([^;]*);", section)
    assert listed is not None
    own = {f for f in flags["mps-control"] if f not in flags["run"]}
    assert set(re.findall(r"`(--[a-z-]+)`", listed[1])) | own == set(flags["mps-control"])
    assert "--metrics-address" not in flags["mps-control"]


def test_every_default_written_beside_a_flag_or_env_var_is_the_code_default(
    flags: dict[str, Flags],
) -> None:
    """`--flag ...` (`ENV`, default `X`), `--flag` default `X`, `ENV`, default `X` and the
    like, in prose: X is that flag's default in some command."""
    defaults: dict[str, set[str | None]] = {}
    for command in flags.values():
        for flag, (env, default) in command.items():
            defaults.setdefault(flag, set()).add(default)
            defaults.setdefault(env, set()).add(default)
    claims = 0
    for doc in (README, CONTRACT):
        text = _text(doc)
        for match in re.finditer(r"`(--[a-z-]+|[A-Z][A-Z_]+)[^`]*`", text):
            name = match[1]
            if name not in defaults:
                continue
            after = text[match.end() : match.end() + 60]
            nearest = re.match(r"[^`]{0,30}?(?:`[A-Z_]+`[^`]{0,12}?)?default `([^`]+)`", after)
            if nearest:
                claims += 1
                assert nearest[1] in defaults[name], (doc, name, nearest[1])
    assert claims >= 10  # the claims are still found: the doc's wording did not slip past


def test_readme_run_defaults_sentence(flags: dict[str, Flags]) -> None:
    section = _section(README, "### run: the device plugin")
    sentence = re.search(r"Defaults: (.*?)\. ", section)
    assert sentence is not None
    pairs = re.findall(r"`(--[a-z-]+) ([^`]+)`", sentence[1])
    assert len(pairs) >= 5
    for flag, value in pairs:
        assert flags["run"][flag][1] == value, flag


def test_readme_env_var_lists(flags: dict[str, Flags]) -> None:
    section = _section(README, "### run: the device plugin")
    run_list = re.search(
        r"Every flag also reads an environment variable: (.*?)\. Defaults", section
    )
    assert run_list is not None
    run_envs = {env for env, _ in flags["run"].values()}
    assert set(re.findall(r"`([A-Z][A-Z_]+)`", run_list[1])) == run_envs
    others = re.search(r"The other commands' flags do too: (.*?)\. The full list", section)
    assert others is not None
    groups = re.findall(r"((?:`[A-Z_]+`(?:, | and )?)+) \(`([a-z-]+)`\)", others[1])
    assert {command for _, command in groups} == {"mps-control", "run-dra", "top"}
    for envs, command in groups:
        own = {env for env, _ in flags[command].values()} - run_envs
        assert set(re.findall(r"`([A-Z_]+)`", envs)) == own, command


def _g(value: float) -> str:
    return f"{value:g}"


# (doc, phrase): each phrase is built from the code's value, so either side changing alone
# fails. The phrases are the docs' own wording.
LIMITS = (
    # GPUs looked for again after a start without them.
    (README, f"looks again after {_g(SourceOptions().rediscover_s)} s, then less and less often"),
    (README, f"(doubling, up to every {_g(REDISCOVER_MAX_S / 60)} minutes)"),
    (
        CONTRACT,
        f"again after {_g(SourceOptions().rediscover_s)} s (then 2, 4, ... up to "
        f"{_g(REDISCOVER_MAX_S)} s)",
    ),
    (
        ARCHITECTURE,
        f"looked for again after {_g(SourceOptions().rediscover_s)} s, doubling to "
        f"{_g(REDISCOVER_MAX_S)} s",
    ),
    # Unix socket paths.
    (README, f"a unix socket path's {unix_grpc.MAX_SOCKET_PATH_BYTES} bytes"),
    (CONTRACT, f"the {unix_grpc.MAX_SOCKET_PATH_BYTES} bytes of a unix socket path"),
    (CONTRACT, f"over the {unix_grpc.MAX_SOCKET_PATH_BYTES}-byte limit of a unix socket path"),
    (CONTRACT, f"fits a unix socket ({unix_grpc.MAX_SOCKET_PATH_BYTES} bytes)"),
    # ResourceSlices.
    (
        CONTRACT,
        f"at most {MAX_DEVICES_PER_SLICE} devices each "
        f"({MAX_DEVICES_WITH_TAINTS_OR_COUNTERS} where a device consumes counters or "
        f"has taints; counter sets in slices of their own, at most {MAX_COUNTER_SETS_PER_SLICE} "
        "each)",
    ),
    (CONTRACT, f"At most {MAX_DEVICES_WITH_TAINTS_OR_COUNTERS} such devices a slice"),
    (
        ARCHITECTURE,
        f"slices of at most {MAX_DEVICES_PER_SLICE} devices, "
        f"{MAX_DEVICES_WITH_TAINTS_OR_COUNTERS} where a device consumes counters or "
        "has taints",
    ),
    # Config and messages.
    (README, f"files over {MAX_BYTES >> 20} MiB are refused"),
    (CONTRACT, f"A config is at most {MAX_BYTES >> 20} MiB of UTF-8 YAML"),
    (CONTRACT, f"a resource over {MAX_DEVICES_PER_RESOURCE:,} devices"),
    (
        CONTRACT,
        f"at most {KUBELET_MAX_RECEIVE_MESSAGE_BYTES >> 20} MiB per message (kubelet's own "
        "receive limit)",
    ),
    (README, f"ignoredXids: [{', '.join(map(str, DEFAULT_IGNORED_XIDS))}] # application errors"),
    (
        README,
        f"recoveryQuietPeriodSeconds: {Health().recovery_quiet_period_seconds} "
        f"recoveryCheckSeconds: {Health().recovery_check_seconds} "
        f"recoveryCheckMaxSeconds: {Health().recovery_check_max_seconds}",
    ),
    # MPS.
    (README, f"`flags.mpsRoot` (default `{ConfigFlags().mps_root}`)"),
    (README, f"({MPS_CLIENTS_NEW} per GPU, {MPS_CLIENTS_OLD} before compute capability 7.5)"),
    (
        README,
        f"not confirmed it for {('one', 'two', 'three', 'four')[STALE_HEARTBEATS - 1]} heartbeats",
    ),
    # Per-pod usage.
    (README, f"`usage.overShareSeconds` (default {DEFAULT_OVER_SHARE_SECONDS})"),
    (README, f"every quarter of that time ({_g(usage._CHECK_S[0])} to {_g(usage._CHECK_S[1])} s)"),
    (
        CONTRACT,
        f"every quarter of `overShareSeconds`, {_g(usage._CHECK_S[0])} to "
        f"{_g(usage._CHECK_S[1])} s",
    ),
    (ARCHITECTURE, f"`overShareSeconds` ({_g(usage._CHECK_S[0])}-{_g(usage._CHECK_S[1])} s)"),
    # The Kubernetes API.
    (CONTRACT, f"(GET, at most {_g(node_side._LABEL_FETCH_TIMEOUT_S)} s at start"),
    (ARCHITECTURE, f"bounded to {_g(node_side._LABEL_FETCH_TIMEOUT_S)} s"),
    (CONTRACT, f"does not answer within {_g(apiconfig.START_TIMEOUT_S)} s at start"),
    (
        CONTRACT,
        f"a server-side timeout of {kube.WATCH_TIMEOUT_S[0]}-{kube.WATCH_TIMEOUT_S[1]} s; a "
        f"watch silent {kube._GUARD_S} s longer",
    ),
    (
        CONTRACT,
        f"back off from {_g(kube.BACKOFF_S[0])} s doubling to {_g(kube.BACKOFF_S[1])} s",
    ),
    (CONTRACT, f"within {_g(nodestatus._AGGREGATE_S / 60)} minutes increments"),
    (
        CONTRACT,
        f"may file {nodestatus._BURST} events at once and one more every "
        f"{_g(nodestatus._REFILL_S / 60)} minutes",
    ),
    (CONTRACT, f"Messages are cut to {nodestatus._MAX_MESSAGE} characters"),
    # DRA health.
    (CONTRACT, f"every {_g(dra_health.RESEND_S)} s while nothing changes"),
    (CONTRACT, f"health_check_timeout_seconds: {dra_health.TIMEOUT_S}"),
    # Stopping a resource, draining.
    (ARCHITECTURE, f"(at most `STOP_GRACE_S`, {_g(unix_grpc.STOP_GRACE_S)} s)"),
    (ARCHITECTURE, f"for {_g(servicer.STALLED_SEND_S)} s in a send begun before the stop"),
    (ARCHITECTURE, f"`SHUTDOWN_BOUND_S`, {_g(server.SHUTDOWN_BOUND_S)} s"),
    (
        CONTRACT,
        "open no ListAndWatch stream for it within "
        f"{_g(stream_watch.STREAM_OPEN_BOUND_S)} s (it dropped the registration",
    ),
    (ARCHITECTURE, f"every `drain_recheck_s` ({_g(RunOptions().drain_recheck_s)} s)"),
)


@pytest.mark.parametrize(("doc", "phrase"), LIMITS, ids=[p[:48] for _, p in LIMITS])
def test_limit_in_docs_is_the_codes(doc: str, phrase: str) -> None:
    assert " ".join(phrase.split()) in _text(doc)
