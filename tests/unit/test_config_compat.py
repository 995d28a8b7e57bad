"""Configs written for the reference plugin's newer v1 keys: accepted with its meaning, or refused
at the exact line with its words."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import yaml_fast
from hypothesis import given, settings
from hypothesis import strategies as st

from sharing_plugin.config.advice import config_notes
from sharing_plugin.config.compat import GO_MAX_DURATION
from sharing_plugin.config.loader import dump_config, parse_config
from sharing_plugin.config.model import (
    DEFAULT_IGNORED_XIDS,
    Config,
    DeviceDiscoveryStrategy,
    EventType,
)
from sharing_plugin.daemon.node.health_monitor import HealthEnv
from sharing_plugin.errors import ConfigError

XID, DBE, SBE = (e.value for e in EventType)


@dataclass(frozen=True)
class Valid:
    text: str
    check: Callable[[Config], bool] = lambda c: True
    warnings: tuple[str, ...] = ()  # each must appear in one warning; none: no warning at all


@dataclass(frozen=True)
class Invalid:
    text: str
    where: str  # "LINE:COL" of the first problem
    path: str
    says: str


def health(c: Config) -> tuple[bool, tuple[int, ...], tuple[int, ...] | None]:
    return c.health.enabled, c.health.ignored_xids, c.health.critical_xids


def ts(extra: str) -> str:
    """A time-slicing section; `extra` lands on line 3."""
    return f"sharing:\n  timeSlicing:\n{extra}    resources: [{{name: gpu, replicas: 2}}]\n"


CASES: dict[str, Valid | Invalid] = {
    # --- health: the reference's newer form -------------------------------------------------
    "disabled true": Valid(
        "health:\n  disabled: true\n", lambda c: health(c) == (False, DEFAULT_IGNORED_XIDS, None)
    ),
    "disabled false": Valid("health: {disabled: false}\n", lambda c: c.health.enabled),
    "disabled agrees with enabled": Valid(
        "health:\n  enabled: false\n  disabled: true\n", lambda c: not c.health.enabled
    ),
    "disabled contradicts enabled": Invalid(
        "health:\n  enabled: true\n  disabled: true\n",
        "2:12",
        "health.enabled",
        "enabled: true and disabled: true contradict each other; keep one of the two",
    ),
    "disabled not a bool": Invalid(
        "health:\n  disabled: yes please\n", "2:13", "health.disabled", "must be true or false"
    ),
    "ignoredXIDs": Valid(
        "health:\n  ignoredXIDs: [13, 31]\n", lambda c: c.health.ignored_xids == (13, 31)
    ),
    "ignoredXIDs empty": Valid(
        "health: {ignoredXIDs: []}\n", lambda c: c.health.ignored_xids == ()
    ),
    "ignoredXIDs and ignoredXids": Invalid(
        "health:\n  ignoredXids: [13]\n  ignoredXIDs: [13]\n",
        "3:16",
        "health.ignoredXIDs",
        "give one of ignoredXids or ignoredXIDs",
    ),
    "ignoredXIDs negative": Invalid(
        "health:\n  ignoredXIDs: [13, -1]\n", "2:21", "health.ignoredXIDs[1]", "must be >= 0"
    ),
    "criticalXIDs all": Valid(
        "health: {criticalXIDs: all}\n", lambda c: health(c) == (True, DEFAULT_IGNORED_XIDS, None)
    ),
    "criticalXIDs ALL": Valid(
        "health: {criticalXIDs: ALL}\n", lambda c: c.health.critical_xids is None
    ),
    "criticalXIDs list (GKE form)": Valid(
        f"health:\n  eventTypes: [{XID}]\n  criticalXIDs: [48]\n",
        lambda c: health(c) == (True, DEFAULT_IGNORED_XIDS, (48,)),
    ),
    "criticalXIDs empty warns": Valid(
        "health: {criticalXIDs: []}\n",
        lambda c: c.health.critical_xids == (),
        ("health.criticalXIDs: the list is empty, so no Xid marks a GPU Unhealthy",),
    ),
    "criticalXIDs other string": Invalid(
        "health:\n  criticalXIDs: some\n",
        "2:17",
        "health.criticalXIDs",
        "invalid string value for criticalXIDs: some; write all or a list of Xid numbers",
    ),
    "criticalXIDs float": Invalid(
        "health:\n  criticalXIDs: [48.0]\n", "2:18", "health.criticalXIDs[0]", "must be an integer"
    ),
    "xid in both lists": Invalid(
        "health:\n  ignoredXIDs: [48, 79]\n  criticalXIDs: [94, 48]\n",
        "3:22",
        "health.criticalXIDs[1]",
        "XID 48 is in both ignored and critical lists",
    ),
    "xid in both lists, our spelling": Invalid(
        "health:\n  ignoredXids: [79]\n  criticalXIDs: [79]\n",
        "3:18",
        "health.criticalXIDs[0]",
        "XID 79 is in both ignored and critical lists",
    ),
    "xid in the default ignored list warns": Valid(
        "health:\n  criticalXIDs: [13, 48]\n",
        lambda c: health(c) == (True, DEFAULT_IGNORED_XIDS, (13, 48)),
        ("health.criticalXIDs: 13 also in the default ignored Xids",),
    ),
    "criticalXids misspelt": Invalid(
        "health:\n  criticalXids: [48]\n",
        "2:3",
        "health.criticalXids",
        "did you mean 'criticalXIDs'?",
    ),
    "eventTypes xid": Valid(
        f"health: {{eventTypes: [{XID}]}}\n", lambda c: c.health.critical_xids is None
    ),
    "eventTypes with ECC: honoured, no warning": Valid(
        f"health:\n  eventTypes: [{XID}, {DBE}, {SBE}]\n",
        lambda c: c.health.critical_xids is None,
    ),
    "eventTypes without xid: no Xid counts": Valid(
        f"health:\n  eventTypes: [{DBE}]\n  criticalXIDs: [48]\n",
        lambda c: c.health.critical_xids == (),
        (f"{XID} is not listed, so no Xid marks a GPU Unhealthy (double-bit ECC errors",),
    ),
    "eventTypes invalid": Invalid(
        f"health:\n  eventTypes: [{XID}, InvalidEventType]\n",
        "2:43",
        "health.eventTypes[1]",
        "invalid event type: InvalidEventType",
    ),
    "eventTypes a string": Invalid(
        f"health:\n  eventTypes: {XID}\n", "2:15", "health.eventTypes", "must be a list"
    ),
    "reference health in full": Valid(
        "health:\n  disabled: false\n"
        f"  eventTypes: [{XID}]\n  ignoredXIDs: [13, 31, 43]\n  criticalXIDs: all\n",
        lambda c: health(c) == (True, (13, 31, 43), None),
    ),
    # --- sharing.timeSlicing.strategy -------------------------------------------------------
    "strategy empty warns": Valid(
        ts('    strategy: ""\n'),
        lambda c: c.sharing.time_slicing is not None,
        ("sharing.timeSlicing.strategy: accepted for compatibility; has no effect here",),
    ),
    "strategy packed": Invalid(
        ts("    strategy: packed\n"),
        "3:15",
        "sharing.timeSlicing.strategy",
        'unknown time-slicing strategy: packed; the reference plugin accepts only "" here; '
        "to spread replicas over GPUs or fill one GPU first, set "
        "flags.plugin.sharedDevicesAllocationPolicy",
    ),
    "strategy round-robin": Invalid(
        ts("    strategy: round-robin\n"),
        "3:15",
        "sharing.timeSlicing.strategy",
        "unknown time-slicing strategy: round-robin",
    ),
    # --- flags, gfd, imex -------------------------------------------------------------------
    "every reference flag": Valid(
        "flags:\n  migStrategy: single\n  failOnInitError: false\n  mpsRoot: /run/mps\n"
        "  nvidiaDriverRoot: /run/nvidia/driver\n  nvidiaDevRoot: /\n"
        "  restartOnDeviceUnhealthy: false\n  gdrcopyEnabled: false\n  gdsEnabled: false\n"
        "  mofedEnabled: false\n  useNodeFeatureAPI: true\n  deviceDiscoveryStrategy: nvml\n"
        "  plugin:\n    passDeviceSpecs: true\n    deviceListStrategy: [envvar, cdi-cri]\n"
        "    deviceIDStrategy: index\n    cdiAnnotationPrefix: cdi.k8s.io/\n"
        "    nvidiaCTKPath: /usr/bin/nvidia-ctk\n    containerDriverRoot: /driver-root\n"
        "    kubeletSocket: /var/lib/kubelet/device-plugins/kubelet.sock\n"
        "    cdiFeatureFlags: disable-multiple-csv-devices\n"
        "  gfd:\n    oneshot: false\n    noTimestamp: false\n    sleepInterval: 60s\n"
        "    outputFile: /etc/kubernetes/node-feature-discovery/features.d/gfd\n"
        "    machineTypeFile: /sys/class/dmi/id/product_name\n"
        "imex:\n  channelIDs: [0]\n  required: true\n",
        lambda c: c.flags.plugin.device_id_strategy == "index" and c.imex is not None,
        ("flags.gfd", "flags.plugin.cdiFeatureFlags", "imex"),
    ),
    "gfd.useNodeFeatureAPI is flags.useNodeFeatureAPI": Valid(
        "flags:\n  gfd:\n    useNodeFeatureAPI: true\n",
        lambda c: c.flags.use_node_feature_api is True,
        (),
    ),
    "useNodeFeatureAPI in both places, contradicting": Invalid(
        "flags:\n  useNodeFeatureAPI: false\n  gfd:\n    useNodeFeatureAPI: true\n",
        "4:24",
        "flags.gfd.useNodeFeatureAPI",
        "contradicts flags.useNodeFeatureAPI (false)",
    ),
    "deviceDiscoveryStrategy empty is auto": Valid(
        'flags: {deviceDiscoveryStrategy: ""}\n',
        lambda c: c.flags.device_discovery_strategy is DeviceDiscoveryStrategy.AUTO,
        ("flags.deviceDiscoveryStrategy",),
    ),
    "deviceDiscoveryStrategy tegra": Valid(
        "flags: {deviceDiscoveryStrategy: tegra}\n",
        lambda c: c.flags.device_discovery_strategy is DeviceDiscoveryStrategy.TEGRA,
        ("flags.deviceDiscoveryStrategy",),
    ),
    "sleepInterval compound duration": Valid(
        "flags:\n  gfd:\n    sleepInterval: 1h2m3.5s\n",
        lambda c: c.flags.gfd is not None and c.flags.gfd.sleep_interval == "1h2m3.5s",
        ("flags.gfd",),
    ),
    "sleepInterval nanoseconds": Valid(
        "flags:\n  gfd:\n    sleepInterval: 60000000000\n",
        lambda c: c.flags.gfd is not None and c.flags.gfd.sleep_interval == 60_000_000_000,
        ("flags.gfd",),
    ),
    "sleepInterval not a duration": Invalid(
        "flags:\n  gfd:\n    sleepInterval: 60 seconds\n",
        "3:20",
        "flags.gfd.sleepInterval",
        "'60 seconds' is not a duration: write it like 60s, 5m or 1h30m",
    ),
    # The reference's Duration reads exactly `infinite` as math.MaxInt64 (IsInfinite).
    "sleepInterval infinite": Valid(
        "flags:\n  gfd:\n    sleepInterval: infinite\n",
        lambda c: c.flags.gfd is not None and c.flags.gfd.sleep_interval == GO_MAX_DURATION,
        ("flags.gfd",),
    ),
    "sleepInterval Infinite is not infinite": Invalid(
        "flags:\n  gfd:\n    sleepInterval: Infinite\n",
        "3:20",
        "flags.gfd.sleepInterval",
        "'Infinite' is not a duration: write it like 60s, 5m or 1h30m, or infinite",
    ),
    "deviceListStrategy string": Valid(
        "flags:\n  plugin:\n    deviceListStrategy: volume-mounts\n",
        lambda c: [str(s) for s in c.flags.plugin.device_list_strategy] == ["volume-mounts"],
    ),
    "imex channelIDs not ints": Invalid(
        "imex:\n  channelIDs: [zero]\n", "2:16", "imex.channelIDs[0]", "must be an integer"
    ),
    # The reference starts only with [] or [0] (AssertChannelIDsValid, checked in validateFlags).
    "imex channelIDs empty": Valid(
        "imex:\n  channelIDs: []\n",
        lambda c: c.imex is not None and c.imex.channel_ids == (),
        ("imex",),
    ),
    "imex channelIDs [0]": Valid(
        "imex: {channelIDs: [0], required: true}\n",
        lambda c: c.imex is not None and c.imex.channel_ids == (0,),
        ("imex",),
    ),
    "imex channelIDs [2]": Invalid(
        "imex:\n  channelIDs: [2]\n",
        "2:15",
        "imex.channelIDs",
        "must be [] or [0] (got [2]): the reference plugin refuses any other channel IDs at start",
    ),
    "imex channelIDs [0, 1]": Invalid(
        "imex:\n  required: true\n  channelIDs: [0, 1]\n",
        "3:15",
        "imex.channelIDs",
        "must be [] or [0] (got [0, 1])",
    ),
    "imex channelIDs [0, 0]": Invalid(
        "imex:\n  channelIDs:\n  - 0\n  - 0\n", "3:3", "imex.channelIDs", "(got [0, 0])"
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_compat_case(name: str) -> None:
    case = CASES[name]
    if isinstance(case, Valid):
        loaded = parse_config(case.text, file="c.yaml")
        assert case.check(loaded.config), loaded.config
        if not case.warnings:
            assert loaded.warnings == ()
        for expected in case.warnings:
            assert any(expected in w for w in loaded.warnings), loaded.warnings
        # Whatever spelling was read, the dump is ours and reads back to the same config.
        dumped = dump_config(loaded.config)
        assert parse_config(yaml_fast.dump(dumped), file="d.yaml").config == loaded.config
        return
    with pytest.raises(ConfigError) as raised:
        parse_config(case.text, file="c.yaml")
    problem = raised.value.problems[0]
    assert f"{problem.line}:{problem.column}" == case.where, str(problem)
    assert problem.path == case.path, str(problem)
    assert case.says in problem.message, str(problem)
    assert "\n" not in str(problem)


def test_a_contradiction_names_both_lines() -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config("health:\n  disabled: false\n  enabled: false\n", file="c.yaml")
    assert [(p.line, p.path) for p in raised.value.problems] == [
        (2, "health.disabled"),
        (3, "health.enabled"),
    ]


def test_the_reference_spellings_are_gone_after_load() -> None:
    loaded = parse_config("health: {disabled: true, ignoredXIDs: [1]}\n", file="c.yaml")
    assert loaded.config.health.disabled is None
    assert loaded.config.health.ignored_xids_reference is None
    assert dump_config(loaded.config)["health"] == {
        "enabled": False,
        "ignoredXids": [1],
        "recoveryQuietPeriodSeconds": 60,
        "recoveryCheckSeconds": 30,
        "recoveryCheckMaxSeconds": 300,
    }


def xids_that_count(text: str, environ: dict[str, str] | None = None) -> set[int] | None:
    """Which of Xids 0..200 mark a GPU Unhealthy; None when health checks are off."""
    config = parse_config(text, file="c.yaml").config
    settings = HealthEnv.from_environ(environ or {}).settings(config.health)
    if not settings.enabled:
        return None
    return {x for x in range(200) if settings.policy.is_critical(x)}


def test_critical_xids_reach_the_monitor_with_the_reference_meaning() -> None:
    assert xids_that_count("health: {criticalXIDs: [48, 79]}\n") == {48, 79}
    # An ignored Xid never counts, as in the reference's IsCritical.
    assert xids_that_count("health: {criticalXIDs: [13, 48]}\n") == {48}
    assert xids_that_count("health: {criticalXIDs: []}\n") == set()
    assert xids_that_count(f"health: {{eventTypes: [{DBE}]}}\n") == set()
    every = xids_that_count("health: {criticalXIDs: all}\n")
    assert every == set(range(200)) - set(DEFAULT_IGNORED_XIDS)
    assert xids_that_count("health: {disabled: true, criticalXIDs: [48]}\n") is None


def test_critical_xids_with_the_reference_environment_variables() -> None:
    text = "health: {criticalXIDs: [48, 79]}\n"
    assert xids_that_count(text, {"DP_ENABLE_HEALTHCHECKS": "13"}) == {13, 48, 79}
    assert xids_that_count(text, {"DP_DISABLE_HEALTHCHECKS": "79"}) == {48}
    assert xids_that_count(text, {"DP_ENABLE_HEALTHCHECKS": "all"}) == set(range(200))
    assert xids_that_count(text, {"DP_DISABLE_HEALTHCHECKS": "all"}) is None


def test_a_written_default_list_is_checked_but_a_default_one_is_not() -> None:
    written = f"health:\n  ignoredXids: {list(DEFAULT_IGNORED_XIDS)}\n  criticalXIDs: [13]\n"
    with pytest.raises(ConfigError):
        parse_config(written, file="c.yaml")
    loaded = parse_config("health: {criticalXIDs: [13]}\n", file="c.yaml")
    assert "ignoredXids" not in dump_config(loaded.config)["health"]


XIDS = st.lists(st.integers(0, 120), max_size=4)
HEALTH = st.fixed_dictionaries(
    {},
    optional={
        "enabled": st.booleans(),
        "disabled": st.booleans(),
        "ignoredXids": XIDS,
        "ignoredXIDs": XIDS,
        "criticalXIDs": st.one_of(st.sampled_from(["all", "ALL"]), XIDS),
        "eventTypes": st.lists(st.sampled_from([XID, DBE, SBE]), max_size=3),
    },
)


@settings(max_examples=150, deadline=None)
@given(raw=HEALTH)
def test_accepted_health_sections_round_trip(raw: dict[str, object]) -> None:
    try:
        loaded = parse_config(yaml_fast.dump({"health": raw}), file="gen.yaml")
    except ConfigError:
        return  # contradictions and overlaps are refused; only accepted ones matter here
    dumped = dump_config(loaded.config)
    assert not {"disabled", "ignoredXIDs"} & set(dumped["health"])
    again = parse_config(yaml_fast.dump(dumped), file="dump.yaml")
    assert again.config == loaded.config


def test_event_types_reach_the_monitor_as_the_reference_registers_them() -> None:
    def kinds(text: str) -> set[str]:
        config = parse_config(text, file="c.yaml").config
        return {str(k) for k in HealthEnv().settings(config.health).event_kinds}

    every = {"xid", "double-bit-ecc", "single-bit-ecc"}
    assert kinds("version: v1\n") == every  # the reference's default: all three
    assert kinds("health: {eventTypes: []}\n") == every
    assert kinds(f"health: {{eventTypes: [{XID}]}}\n") == {"xid"}
    assert kinds(f"health: {{eventTypes: [{DBE}, {SBE}]}}\n") == {
        "double-bit-ecc",
        "single-bit-ecc",
    }


def test_an_infinite_sleep_interval_is_written_back_as_infinite() -> None:
    # As the reference's Duration.MarshalJSON: the longest duration is `infinite`, never a number.
    for text in ("sleepInterval: infinite", f"sleepInterval: {GO_MAX_DURATION}"):
        loaded = parse_config(f"flags:\n  gfd:\n    {text}\n", file="c.yaml")
        assert dump_config(loaded.config)["flags"]["gfd"] == {"sleepInterval": "infinite"}
    loaded = parse_config("flags: {gfd: {sleepInterval: 60s}}\n", file="c.yaml")
    assert dump_config(loaded.config)["flags"]["gfd"] == {"sleepInterval": "60s"}


def shared(entry: str, *, rename_by_default: bool = False, section: str = "timeSlicing") -> str:
    flag = "    renameByDefault: true\n" if rename_by_default else ""
    return f"sharing:\n  {section}:\n{flag}    resources:\n    - {entry}\n"


# What the reference's binary resets at start (DisableResourceNamingInConfig, with a warning)
# while this plugin honours it: each config -> the notes it gets (a prefix of each, in order).
NOTES: dict[str, tuple[str, list[str]]] = {
    "plain sharing": (shared("{name: gpu, replicas: 2}"), []),
    "renameByDefault alone": (shared("{name: gpu, replicas: 2}", rename_by_default=True), []),
    "renameByDefault and its own rename": (
        shared("{name: gpu, rename: gpu.shared, replicas: 2}", rename_by_default=True),
        [],
    ),
    "rename to itself": (shared("{name: gpu, rename: gpu, replicas: 2}"), []),
    "explicit rename": (
        shared("{name: gpu, rename: gpu.ts, replicas: 2}"),
        [
            "sharing.timeSlicing.resources[0].rename: honoured here; NVIDIA's device plugin "
            "ignores it and advertises nvidia.com/gpu, not nvidia.com/gpu.ts"
        ],
    ),
    "explicit rename under renameByDefault": (
        shared("{name: gpu, rename: gpu.ts, replicas: 2}", rename_by_default=True, section="mps"),
        [
            "sharing.mps.resources[0].rename: honoured here; NVIDIA's device plugin ignores it and "
            "advertises nvidia.com/gpu.shared, not nvidia.com/gpu.ts"
        ],
    ),
    "devices all": (shared("{name: gpu, devices: all, replicas: 2}"), []),
    "devices count": (
        shared("{name: gpu, devices: 2, replicas: 2}"),
        [
            "sharing.timeSlicing.resources[0].devices: honoured here; NVIDIA's device plugin "
            "ignores it and shares every nvidia.com/gpu device, not only the selected ones"
        ],
    ),
    "devices list": (
        shared("{name: gpu, devices: [0], replicas: 2}"),
        ["sharing.timeSlicing.resources[0].devices: honoured here"],
    ),
    "resources gpus": (
        "resources:\n  gpus: [{pattern: '*A100*', name: a100}, {pattern: '*', name: a100}]\n",
        [
            "resources.gpus: honoured here; NVIDIA's device plugin ignores it and advertises "
            "every full GPU as nvidia.com/gpu, not nvidia.com/a100"
        ],
    ),
    "resources mig": (
        "resources:\n  mig: [{pattern: '1g.*', name: small}]\n",
        [
            "resources.mig: honoured here; NVIDIA's device plugin ignores it and advertises MIG "
            "devices as migStrategy names them"
        ],
    ),
}


@pytest.mark.parametrize("name", list(NOTES))
def test_what_the_reference_binary_would_ignore_is_noted(name: str) -> None:
    text, expected = NOTES[name]
    notes = config_notes(parse_config(text, file="c.yaml").config)
    assert len(notes) == len(expected), notes
    for note, prefix in zip(notes, expected, strict=True):
        assert note.startswith(prefix), note
        assert "\n" not in note


def test_notes_are_not_warnings() -> None:
    # Honoured keys are what this plugin is for: they say where it differs, not that it is wrong.
    loaded = parse_config(
        shared("{name: gpu, rename: gpu.ts, devices: [0], replicas: 2}"), file="c"
    )
    assert loaded.warnings == ()
    assert len(config_notes(loaded.config)) == 2
