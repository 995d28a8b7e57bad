"""Table of configs: each is accepted with the stated meaning, or refused at the exact line."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from sharing_plugin.config.loader import parse_config
from sharing_plugin.config.model import (
    Config,
    DeviceListStrategy,
    GpuIndexRef,
    MigGiCiRef,
    MigIndexRef,
    MigStrategy,
    ProductRef,
    UuidRef,
)
from sharing_plugin.errors import ConfigError

GPU = "GPU-b1028956-cfa2-0990-bf4a-5da9abb51763"
MIG = "MIG-8ffd3ec4-8a4a-5b6b-9a0c-2d3c1b0a9e11"


def ts(devices: str, replicas: str = "2") -> str:
    """A time-slicing config with one entry; `devices` is on line 6, replicas on line 7."""
    return (
        "version: v1\n"
        "sharing:\n"
        "  timeSlicing:\n"
        "    resources:\n"
        "    - name: gpu\n"
        f"      devices: {devices}\n"
        f"      replicas: {replicas}\n"
    )


@dataclass(frozen=True)
class Valid:
    text: str
    check: Callable[[Config], bool] = lambda c: True
    warning: str | None = None


@dataclass(frozen=True)
class Invalid:
    text: str
    where: str  # "LINE:COL"
    path: str
    says: str


def entry(c: Config, i: int = 0):  # type: ignore[no-untyped-def]
    assert c.sharing.active is not None
    return c.sharing.active.resources[i]


CASES: dict[str, Valid | Invalid] = {
    # --- replicas ---------------------------------------------------------------------------
    "replicas 2": Valid(ts("all"), lambda c: entry(c).replicas == 2),
    "replicas 1 warns": Valid(ts("all", "1"), warning="resources[0].replicas: 1 means not shared"),
    "replicas 0": Invalid(
        ts("all", "0"), "7:17", "sharing.timeSlicing.resources[0].replicas", "must be >= 1 (got 0)"
    ),
    "replicas -1": Invalid(
        ts("all", "-1"),
        "7:17",
        "sharing.timeSlicing.resources[0].replicas",
        "must be >= 1 (got -1)",
    ),
    "replicas over kubelet limit": Invalid(
        ts("all", "60001"), "7:17", "sharing.timeSlicing.resources[0].replicas", "must be <= 60000"
    ),
    "replicas as float": Invalid(
        ts("all", "2.0"), "7:17", "sharing.timeSlicing.resources[0].replicas", "must be an integer"
    ),
    "replicas as string": Invalid(
        ts("all", '"2"'), "7:17", "sharing.timeSlicing.resources[0].replicas", "must be an integer"
    ),
    "replicas missing": Invalid(
        "sharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n",
        "4:7",
        "sharing.timeSlicing.resources[0].replicas",
        "required field 'replicas' is missing",
    ),
    # --- devices forms ----------------------------------------------------------------------
    "devices all": Valid(ts("all"), lambda c: entry(c).devices == "all"),
    "devices count": Valid(ts("2"), lambda c: entry(c).devices == 2),
    "devices [0]": Valid(ts("[0]"), lambda c: entry(c).devices == (GpuIndexRef(0),)),
    'devices ["0"]': Valid(ts('["0"]'), lambda c: entry(c).devices == (GpuIndexRef(0),)),
    'devices ["0:0"]': Valid(ts('["0:0"]'), lambda c: entry(c).devices == (MigIndexRef(0, 0),)),
    "devices GPU uuid": Valid(ts(f"[{GPU}]"), lambda c: entry(c).devices == (UuidRef(GPU),)),
    "devices MIG uuid": Valid(ts(f"[{MIG}]"), lambda c: entry(c).devices == (UuidRef(MIG),)),
    "devices MIG-GPU/gi/ci": Valid(
        ts(f"[MIG-{GPU}/0/0]"), lambda c: entry(c).devices == (MigGiCiRef(GPU, 0, 0),)
    ),
    "devices product": Valid(
        ts('[{product: "NVIDIA A100*"}]'),
        lambda c: entry(c).devices == (ProductRef("NVIDIA A100*"),),
    ),
    "devices default all": Valid(
        "sharing:\n  timeSlicing:\n    resources: [{name: gpu, replicas: 3}]\n",
        lambda c: entry(c).devices == "all",
    ),
    "devices not-all": Invalid(
        ts("not-all"),
        "6:16",
        "sharing.timeSlicing.resources[0].devices",
        "'not-all' is not a device selection",
    ),
    "devices -2": Invalid(
        ts("-2"),
        "6:16",
        "sharing.timeSlicing.resources[0].devices",
        "a device count must be >= 1 (got -2)",
    ),
    "devices 2.0": Invalid(
        ts("2.0"),
        "6:16",
        "sharing.timeSlicing.resources[0].devices",
        "2.0 is not a device selection",
    ),
    "devices [-1]": Invalid(
        ts("[1, -1]"),
        "6:20",
        "sharing.timeSlicing.resources[0].devices[1]",
        "GPU index must be >= 0 (got -1)",
    ),
    'devices ["GPU-UUID"]': Invalid(
        ts('["GPU-UUID"]'),
        "6:17",
        "sharing.timeSlicing.resources[0].devices[0]",
        "'GPU-UUID' is not a device reference",
    ),
    "devices MIG-GPU without gi/ci": Invalid(
        ts(f"[MIG-{GPU}]"),
        "6:17",
        "sharing.timeSlicing.resources[0].devices[0]",
        "needs /<gi>/<ci>",
    ),
    "devices listed twice": Invalid(
        ts('[0, "0"]'),
        "6:20",
        "sharing.timeSlicing.resources[0].devices[1]",
        "GPU 0 is listed twice",
    ),
    # --- names ------------------------------------------------------------------------------
    "name normalised": Valid(
        ts("all").replace("name: gpu", "name: valid"), lambda c: entry(c).name == "nvidia.com/valid"
    ),
    "full name kept": Valid(
        ts("all").replace("name: gpu", "name: example.com/gpu"),
        lambda c: entry(c).name == "example.com/gpu",
    ),
    "name $invalid$": Invalid(
        ts("all").replace("name: gpu", "name: $invalid$"),
        "5:13",
        "sharing.timeSlicing.resources[0].name",
        "'$invalid$'",
    ),
    "name with two slashes": Invalid(
        ts("all").replace("name: gpu", "name: a/b/c"),
        "5:13",
        "sharing.timeSlicing.resources[0].name",
        "exactly one '/'",
    ),
    "name under kubernetes.io": Invalid(
        ts("all").replace("name: gpu", "name: kubernetes.io/gpu"),
        "5:13",
        "sharing.timeSlicing.resources[0].name",
        "reserved",
    ),
    "rename normalised": Valid(
        ts("all").replace("name: gpu", "name: gpu\n      rename: gpu.small"),
        lambda c: entry(c).rename == "nvidia.com/gpu.small",
    ),
    "resources.gpus pattern": Valid(
        "resources:\n  gpus:\n  - pattern: '*A100*'\n    name: a100\n",
        lambda c: c.resources.gpus[0].name == "nvidia.com/a100",
    ),
    "resources pattern with ?": Invalid(
        "resources:\n  gpus:\n  - pattern: 'A10?'\n    name: a100\n",
        "3:14",
        "resources.gpus[0].pattern",
        "only '*' is a wildcard",
    ),
    # --- flags ------------------------------------------------------------------------------
    "deviceListStrategy string": Valid(
        "flags:\n  plugin:\n    deviceListStrategy: volume-mounts\n",
        lambda c: c.flags.plugin.device_list_strategy == (DeviceListStrategy.VOLUME_MOUNTS,),
    ),
    "deviceListStrategy list": Valid(
        "flags:\n  plugin:\n    deviceListStrategy: [envvar, cdi-cri]\n",
        lambda c: (
            c.flags.plugin.device_list_strategy
            == (DeviceListStrategy.ENVVAR, DeviceListStrategy.CDI_CRI)
        ),
    ),
    "deviceListStrategy unknown": Invalid(
        "flags:\n  plugin:\n    deviceListStrategy: [envvar, cdi]\n",
        "3:34",
        "flags.plugin.deviceListStrategy[1]",
        "unknown value 'cdi'",
    ),
    "migStrategy typo": Invalid(
        "flags:\n  migStrategy: mixd\n", "2:16", "flags.migStrategy", "did you mean 'mixed'?"
    ),
    "bool as string": Invalid(
        "flags:\n  failOnInitError: 'true'\n",
        "2:20",
        "flags.failOnInitError",
        "must be true or false",
    ),
    "devRoot follows driverRoot": Valid(
        "flags:\n  nvidiaDriverRoot: /run/nvidia/driver\n",
        lambda c: c.flags.nvidia_dev_root == "/run/nvidia/driver",
    ),
    "gfd accepted with warning": Valid(
        "flags:\n  gfd:\n    oneshot: true\n", warning="flags.gfd: accepted for compatibility"
    ),
    "imex accepted with warning": Valid(
        "imex:\n  channelIDs: [0]\n", warning="imex: accepted for compatibility"
    ),
    "version v2": Invalid("version: v2\n", "1:10", "version", "supported versions: v1"),
    # --- the envvar trap: kubelet keeps one NVIDIA_VISIBLE_DEVICES per container ------------
    "envvar with two named resources warns": Valid(
        "sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 2}\n"
        "    - {name: mig-1g.10gb, replicas: 2}\n",
        warning="flags.plugin.deviceListStrategy: envvar with 2 resources (nvidia.com/gpu, "
        "nvidia.com/mig-1g.10gb): a container that requests two of them sees the GPUs of only "
        "one",
    ),
    "envvar with a renamed pattern and a shared name warns": Valid(
        "resources:\n  gpus: [{pattern: '*T4*', name: t4}]\n"
        "sharing:\n  timeSlicing:\n    renameByDefault: true\n"
        "    resources: [{name: gpu, replicas: 2}]\n",
        warning="use deviceListStrategy volume-mounts, cdi-annotations or cdi-cri, or request "
        "one of these resources per container",
    ),
    "one shared resource: no trap": Valid(
        "sharing:\n  timeSlicing:\n    renameByDefault: true\n"
        "    resources: [{name: gpu, replicas: 2}]\n"
    ),
    "volume-mounts: no trap": Valid(
        "flags: {plugin: {deviceListStrategy: volume-mounts}}\n"
        "sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 2}\n"
        "    - {name: mig-1g.10gb, replicas: 2}\n"
    ),
    "envvar with cdi-cri: no trap": Valid(
        "flags: {plugin: {deviceListStrategy: [envvar, cdi-cri]}}\n"
        "sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 2}\n"
        "    - {name: mig-1g.10gb, replicas: 2}\n"
    ),
    # --- sharing modes ----------------------------------------------------------------------
    "MPS default failRequestsGreaterThanOne": Valid(
        "sharing:\n  mps:\n    resources: [{name: gpu, replicas: 2}]\n",
        lambda c: c.sharing.mps is not None and c.sharing.mps.fail_requests_greater_than_one,
    ),
    "time-slicing default failRequestsGreaterThanOne": Valid(
        ts("all"),
        lambda c: (
            c.sharing.time_slicing is not None
            and not c.sharing.time_slicing.fail_requests_greater_than_one
        ),
    ),
    "both sharing modes": Invalid(
        "sharing:\n  timeSlicing:\n    resources: [{name: gpu, replicas: 2}]\n"
        "  mps:\n    resources: [{name: gpu, replicas: 2}]\n",
        "4:3",
        "sharing.mps",
        "timeSlicing and mps cannot both be set",
    ),
    "mps with mixed MIG": Invalid(
        "flags: {migStrategy: mixed}\nsharing:\n  mps:\n"
        "    resources: [{name: gpu, replicas: 2}]\n",
        "3:3",
        "sharing.mps",
        "MPS cannot share MIG devices",
    ),
    "empty resources": Invalid(
        "sharing:\n  timeSlicing:\n    resources: []\n",
        "3:16",
        "sharing.timeSlicing.resources",
        "no resources to share",
    ),
    "per-GPU replicas": Valid(
        ts("[0]") + "    - name: gpu\n      devices: [1]\n      replicas: 5\n",
        lambda c: [e.replicas for e in c.sharing.active.resources] == [2, 5],
    ),  # type: ignore[union-attr]
    "overlapping selections": Invalid(
        ts("[0, 1]") + "    - name: gpu\n      devices: [1]\n      replicas: 5\n",
        "9:16",
        "sharing.timeSlicing.resources[1].devices",
        "overlaps resources[0]",
    ),
    "all overlaps everything": Invalid(
        ts("all") + "    - name: gpu\n      devices: [1]\n      replicas: 5\n",
        "9:16",
        "sharing.timeSlicing.resources[1].devices",
        "both select all devices",
    ),
    "rename collision": Invalid(
        ts("all") + "    - name: mig-1g.10gb\n      rename: gpu\n      replicas: 5\n",
        "9:15",
        "sharing.timeSlicing.resources[1].rename",
        "is also advertised for nvidia.com/gpu",
    ),
    # --- unknown and misplaced keys, duplicates ---------------------------------------------
    "unknown key with suggestion": Invalid(
        "sharing:\n  timeSlicing:\n    renameByDefalt: true\n    resources: []\n",
        "3:5",
        "sharing.timeSlicing.renameByDefalt",
        "did you mean 'renameByDefault'?",
    ),
    "misplaced key": Invalid(
        "flags:\n  renameByDefault: true\n",
        "2:3",
        "flags.renameByDefault",
        "belongs under sharing.mps or sharing.timeSlicing",
    ),
    "wrong case": Invalid(
        "flags:\n  plugin:\n    deviceIdStrategy: index\n",
        "3:5",
        "flags.plugin.deviceIdStrategy",
        "did you mean 'deviceIDStrategy'?",
    ),
    "snake case refused": Invalid(
        "flags:\n  mig_strategy: mixed\n",
        "2:3",
        "flags.mig_strategy",
        "did you mean 'migStrategy'?",
    ),
    "duplicate key": Invalid(
        ts("all", "2") + "      replicas: 3\n",
        "8:7",
        "",
        "duplicate key 'replicas' (first at line 7)",
    ),
    # --- hostile input ----------------------------------------------------------------------
    "alias": Invalid("a: &x [1, 2]\nflags: *x\n", "2:8", "", "aliases (*x) are not allowed"),
    "alias bomb": Invalid(
        "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
        "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\n",
        "2:8",
        "",
        "aliases (*a) are not allowed",
    ),
    "python tag": Invalid(
        "flags: !!python/object/apply:os.system [echo hi]\n",
        "1:8",
        "",
        "tag !!python/object/apply:os.system is not allowed",
    ),
    "merge key": Invalid(
        "flags:\n  <<: {migStrategy: none}\n", "2:3", "", "merge keys (<<) are not allowed"
    ),
    "top level list": Invalid("- version: v1\n", "1:1", "", "a config must be a mapping"),
    "top level string": Invalid("hello\n", "1:1", "", "a config must be a mapping"),
    "two documents": Invalid(
        "version: v1\n---\nversion: v1\n", "2:1", "", "expected a single document"
    ),
    "syntax error": Invalid("flags: [migStrategy\n", "2:1", "", "invalid YAML"),
    "deep nesting": Invalid("a: " + "[" * 100 + "]" * 100 + "\n", "1:", "", "nesting deeper"),
    # --- partitioning -----------------------------------------------------------------------
    "partitioning": Valid(
        "flags: {migStrategy: mixed}\npartitioning:\n  mig:\n  - devices: [0]\n"
        "    profiles: {1g.10gb: 7}\n",
        lambda c: c.partitioning is not None and c.partitioning.mig[0].profiles == {"1g.10gb": 7},
    ),
    "partitioning bad profile": Invalid(
        "partitioning:\n  mig:\n  - profiles: {1g.10: 2}\n",
        "3:16",
        "partitioning.mig[0].profiles.1g.10",
        "is not a MIG profile name",
    ),
    "partitioning overlap": Invalid(
        "partitioning:\n  mig:\n  - devices: [0, 1]\n  - devices: [1]\n    enabled: false\n",
        "4:14",
        "partitioning.mig[1].devices",
        "overlaps mig[0]",
    ),
    "partitioning without migStrategy warns": Valid(
        "partitioning:\n  mig:\n  - profiles: {3g.40gb: 2}\n",
        warning="partitioning.mig: MIG layouts are declared but flags.migStrategy is none",
    ),
    "a dynamic entry needs no migStrategy": Valid(
        "partitioning:\n  mig:\n  - devices: [0]\n    dynamic: true\n",
        lambda c: c.partitioning is not None and c.partitioning.mig[0].dynamic,
    ),
    "empty document": Valid("", lambda c: c == Config()),
    "comments only": Valid("# nothing\n", lambda c: c.flags.mig_strategy is MigStrategy.NONE),
}


@pytest.mark.parametrize("name", list(CASES))
def test_config_case(name: str) -> None:
    case = CASES[name]
    if isinstance(case, Valid):
        loaded = parse_config(case.text, file="c.yaml")
        assert case.check(loaded.config)
        if case.warning is None:
            assert loaded.warnings == ()
        else:
            assert any(case.warning in w for w in loaded.warnings), loaded.warnings
        return
    with pytest.raises(ConfigError) as raised:
        parse_config(case.text, file="c.yaml")
    problem = raised.value.problems[0]
    assert f"{problem.line}:{problem.column}".startswith(case.where), str(problem)
    assert problem.path == case.path, str(problem)
    assert case.says in problem.message, str(problem)
    assert problem.file == "c.yaml"
    assert "\n" not in str(problem)


def test_table_is_large_enough() -> None:
    assert len(CASES) >= 40


def test_every_problem_reported_at_once() -> None:
    text = ts("not-all", "0").replace("version: v1", "version: v1\nflags: {migStrategy: x}")
    with pytest.raises(ConfigError) as raised:
        parse_config(text, file="c.yaml")
    lines = [str(p) for p in raised.value.problems]
    assert lines == [
        "c.yaml:2:22: flags.migStrategy: unknown value 'x'; expected 'none', 'single' or 'mixed'",
        "c.yaml:7:16: sharing.timeSlicing.resources[0].devices: 'not-all' is not a device "
        "selection; use all, a count or a list",
        "c.yaml:8:17: sharing.timeSlicing.resources[0].replicas: must be >= 1 (got 0)",
    ]
