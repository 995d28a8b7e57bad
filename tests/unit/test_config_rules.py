"""Rules between values: checked on the built model, reported beside the field errors.

The model validates each field on its own and builds whatever its fields allow; the rules read
the built model and return issues at their paths, which the loader places at their lines with
the field errors. Where another part of the config has field errors, the valid sections are
still checked, and a section whose own parts are wrong is not compared as a whole.
"""

from __future__ import annotations

import pytest

from sharing_plugin.config import rules
from sharing_plugin.config.base import Issue
from sharing_plugin.config.loader import parse_config, parse_configs
from sharing_plugin.config.model import Config
from sharing_plugin.errors import ConfigError

OVERLAP = (
    "overlaps resources[0] for nvidia.com/gpu (both select GPU 0); entries for the same "
    "resource must select disjoint devices"
)
UNSIZED = (
    "say how many clients share each GPU: set replicas (e.g. 4), or memoryPerReplica "
    "(e.g. 10Gi) to size them by GPU memory"
)


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as raised:
        parse_config(text, file="c.yaml")
    return [str(p) for p in raised.value.problems]


def test_a_broken_rule_is_an_issue_of_the_built_model_not_a_validation_error() -> None:
    config = Config.model_validate(
        {
            "sharing": {
                "timeSlicing": {
                    "resources": [
                        {"name": "gpu", "devices": [0], "replicas": 2},
                        {"name": "gpu", "devices": [0], "replicas": 3},
                    ]
                }
            }
        }
    )
    assert rules.issues(config) == [
        Issue(("sharing", "timeSlicing", "resources", 1, "devices"), OVERLAP)
    ]


def test_every_section_with_rules_is_checked_where_it_is() -> None:
    config = Config.model_validate(
        {
            "sharing": {"mps": {"resources": [{"name": "gpu"}]}},
            "health": {"enabled": True, "disabled": True},
            "partitioning": {"mig": [{"enabled": False, "profiles": {"1g.10gb": 1}}]},
        }
    )
    said = "enabled: true and disabled: true contradict each other; keep one of the two"
    assert rules.issues(config) == [
        Issue(("sharing", "mps", "resources", 0), UNSIZED),
        Issue(("health", "enabled"), said),
        Issue(("health", "disabled"), said),
        Issue(
            ("partitioning", "mig", 0, "profiles"),
            "profiles need MIG: remove them or set enabled: true",
        ),
    ]
    # A contradictory health section keeps what was written (nothing is folded into ours).
    assert config.health.disabled is True


def test_a_valid_config_breaks_no_rule() -> None:
    loaded = parse_config(
        "health: {disabled: true, ignoredXIDs: [1], criticalXIDs: [2]}\n"
        "sharing:\n  mps:\n    resources: [{name: gpu, memoryPerReplica: 10Gi}]\n",
        file="c.yaml",
    )
    assert rules.issues(loaded.config) == []


def test_issues_are_placed_at_their_lines_with_the_field_errors() -> None:
    text = (
        "flags: {migStrategy: mixd}\n"  # a field error
        "sharing:\n"
        "  timeSlicing:\n"
        "    resources:\n"
        "    - {name: gpu, devices: [0], replicas: 2}\n"
        "    - {name: gpu, devices: [0], replicas: 2}\n"  # an overlap, in a valid section
        "health: {ignoredXids: [1], ignoredXIDs: [2]}\n"  # a contradiction
    )
    assert problems(text) == [
        "c.yaml:1:22: flags.migStrategy: unknown value 'mixd'; expected 'none', 'single' or "
        "'mixed' (did you mean 'mixed'?)",
        f"c.yaml:6:28: sharing.timeSlicing.resources[1].devices: {OVERLAP}",
        "c.yaml:7:41: health.ignoredXIDs: give one of ignoredXids or ignoredXIDs: they are two "
        "spellings of the same list",
    ]


def test_a_section_whose_parts_are_wrong_is_not_compared_as_a_whole() -> None:
    # Entry 2 has no size (a rule of the entry), entry 1 a field error: the overlap of entries
    # 0 and 1 is not reported, nor is MPS beside mixed MIG (a rule of the whole config).
    text = (
        "flags: {migStrategy: mixed}\n"
        "sharing:\n"
        "  mps:\n"
        "    resources:\n"
        "    - {name: gpu, devices: [0], replicas: 2}\n"
        "    - {name: gpu, devices: [0], replicas: 2, pinnedMemoryLimit: 10GB}\n"
        "    - {name: gpu, devices: [1]}\n"
    )
    found = problems(text)
    assert [line.split(": ")[1] for line in found] == [
        "sharing.mps.resources[1].pinnedMemoryLimit",
        "sharing.mps.resources[2]",
    ]
    assert found[1] == f"c.yaml:7:7: sharing.mps.resources[2]: {UNSIZED}"


def test_issues_in_a_configmap_point_into_the_manifest() -> None:
    manifest = (
        "apiVersion: v1\n"
        "kind: ConfigMap\n"
        "metadata: {name: m}\n"
        "data:\n"
        "  mixed: |\n"
        "    flags:\n"
        "      migStrategy: mixed\n"
        "    sharing:\n"
        "      mps:\n"
        "        resources: [{name: gpu, replicas: 2}]\n"
    )
    with pytest.raises(ConfigError) as raised:
        parse_configs(manifest, file="cm.yaml")
    assert [str(p) for p in raised.value.problems] == [
        "cm.yaml:9:7: data.mixed: sharing.mps: MPS cannot share MIG devices, and migStrategy: "
        "mixed advertises them; use time-slicing, or migStrategy: none or single"
    ]


# One config per rule -> every line it gets, as `validate` printed it before the rules left the
# model (the text, path and position of each must not change).
ONE_PER_RULE: dict[str, tuple[str, list[str]]] = {
    "mps entry not sized": (
        "sharing:\n  mps:\n    resources:\n    - name: gpu\n",
        [f"c.yaml:4:7: sharing.mps.resources[0]: {UNSIZED}"],
    ),
    "mps replicas 0": (
        "sharing:\n  mps:\n    resources:\n    - name: gpu\n      replicas: 0\n",
        ["c.yaml:5:17: sharing.mps.resources[0].replicas: must be >= 1 (got 0)"],
    ),
    "mps sized twice": (
        "sharing:\n  mps:\n    resources:\n    - name: gpu\n      replicas: 2\n"
        "      memoryPerReplica: 10Gi\n",
        [
            "c.yaml:6:25: sharing.mps.resources[0].memoryPerReplica: replicas and "
            "memoryPerReplica both size the resource: keep one of them"
        ],
    ),
    "entries overlap": (
        "sharing:\n  timeSlicing:\n    resources:\n"
        "    - {name: gpu, devices: [0, 1], replicas: 2}\n"
        "    - {name: gpu, devices: [1], replicas: 3}\n",
        [
            "c.yaml:5:28: sharing.timeSlicing.resources[1].devices: overlaps resources[0] for "
            "nvidia.com/gpu (both select GPU 1); entries for the same resource must select "
            "disjoint devices"
        ],
    ),
    "two renames to one name": (
        "sharing:\n  timeSlicing:\n    resources:\n"
        "    - {name: gpu, rename: shared, replicas: 2}\n"
        "    - {name: nvidia.com/mig-1g.10gb, rename: shared, replicas: 2}\n",
        [
            "c.yaml:5:46: sharing.timeSlicing.resources[1].rename: 'nvidia.com/shared' is also "
            "advertised for nvidia.com/gpu (resources[0]); two resources cannot share one "
            "name: pick another rename"
        ],
    ),
    "a rename onto renameByDefault's name": (
        "sharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n"
        "    - {name: gpu, replicas: 2}\n"
        "    - {name: mig-1g.10gb, rename: gpu.shared, replicas: 2}\n",
        [
            "c.yaml:6:35: sharing.timeSlicing.resources[1].rename: 'nvidia.com/gpu.shared' is "
            "also advertised for nvidia.com/gpu (resources[0]); two resources cannot share one "
            "name: pick another rename"
        ],
    ),
    "both sharing modes": (
        "sharing:\n  timeSlicing:\n    resources: [{name: gpu, replicas: 2}]\n"
        "  mps:\n    resources: [{name: gpu, replicas: 2}]\n",
        [
            "c.yaml:4:3: sharing.mps: timeSlicing and mps cannot both be set: a GPU is shared "
            "one way; keep one of the two sections"
        ],
    ),
    "profiles with MIG off": (
        "partitioning:\n  mig:\n  - devices: all\n    enabled: false\n    profiles: {1g.10gb: 7}\n",
        [
            "c.yaml:5:5: partitioning.mig[0].profiles: profiles need MIG: remove them or set "
            "enabled: true"
        ],
    ),
    "layouts overlap": (
        "partitioning:\n  mig:\n  - devices: [0]\n    profiles: {1g.10gb: 7}\n"
        "  - devices: all\n    profiles: {7g.80gb: 1}\n",
        [
            "c.yaml:5:14: partitioning.mig[1].devices: overlaps mig[0] (both select all "
            "devices); each GPU gets one layout"
        ],
    ),
    "enabled and disabled both true": (
        "health:\n  enabled: true\n  disabled: true\n",
        [
            "c.yaml:2:12: health.enabled: enabled: true and disabled: true contradict each "
            "other; keep one of the two",
            "c.yaml:3:13: health.disabled: enabled: true and disabled: true contradict each "
            "other; keep one of the two",
        ],
    ),
    "two spellings of the ignored list": (
        "health:\n  ignoredXids: [13]\n  ignoredXIDs: [31]\n",
        [
            "c.yaml:3:16: health.ignoredXIDs: give one of ignoredXids or ignoredXIDs: they are "
            "two spellings of the same list"
        ],
    ),
    "an Xid ignored and critical": (
        "health:\n  ignoredXIDs: [13, 48]\n  criticalXIDs: [48, 79, 13]\n",
        [
            "c.yaml:3:18: health.criticalXIDs[0]: XID 48 is in both ignored and critical lists; "
            "remove it from one",
            "c.yaml:3:26: health.criticalXIDs[2]: XID 13 is in both ignored and critical lists; "
            "remove it from one",
        ],
    ),
    "recovery checks out of order": (
        "health:\n  recoveryCheckSeconds: 60\n  recoveryCheckMaxSeconds: 30\n",
        [
            "c.yaml:3:28: health.recoveryCheckMaxSeconds: must be >= recoveryCheckSeconds (60); "
            "got 30"
        ],
    ),
    "mps with mixed MIG": (
        "flags:\n  migStrategy: mixed\n"
        "sharing:\n  mps:\n    resources: [{name: gpu, replicas: 2}]\n",
        [
            "c.yaml:4:3: sharing.mps: MPS cannot share MIG devices, and migStrategy: mixed "
            "advertises them; use time-slicing, or migStrategy: none or single"
        ],
    ),
    "a rename onto a pattern's name": (
        "resources:\n  gpus:\n  - {pattern: '*A100*', name: a100}\n"
        "sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, rename: a100, replicas: 2}\n",
        [
            "c.yaml:7:27: sharing.timeSlicing.resources[0].rename: 'nvidia.com/a100' is already "
            "advertised for resources.gpus[0]; pick another rename"
        ],
    ),
}


@pytest.mark.parametrize("name", list(ONE_PER_RULE))
def test_each_rule_is_reported_at_its_line_in_its_words(name: str) -> None:
    text, lines = ONE_PER_RULE[name]
    assert problems(text) == lines
