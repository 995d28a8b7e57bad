"""Kubernetes extended resource names: normalised and checked once, at load.

The reference plugin prefixes a bare name with `nvidia.com/`; kubelet then refuses any name that
is not a valid extended resource name, but only when the plugin registers, long after the config
was accepted. We check the same rules up front so a typo fails `validate`, not a node.
Names are matched with the reference's `*`-only globs (resource patterns, product selectors).
"""

from __future__ import annotations

import re
from functools import lru_cache

from pydantic_core import PydanticCustomError

# The node label naming which of a ConfigMap's configs a node uses (the reference's key).
DEFAULT_CONFIG_LABEL = "nvidia.com/device-plugin.config"
DEFAULT_PREFIX = "nvidia.com"
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
_NAME_PART = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
RESOURCE_NAME_PATTERN = (
    rf"^(({_DNS_LABEL}(\.{_DNS_LABEL})*)/)?[A-Za-z0-9]([-A-Za-z0-9_.]{{0,61}}[A-Za-z0-9])?$"
)


def _invalid(name: str, why: str) -> PydanticCustomError:
    return PydanticCustomError("resource_name", "{detail}", {"detail": f"{name!r}: {why}"})


def normalise_resource_name(name: str) -> str:
    """`gpu` -> `nvidia.com/gpu`; a full name is checked as kubelet would check it."""
    full = name if "/" in name else f"{DEFAULT_PREFIX}/{name}"
    prefix, _, part = full.partition("/")
    if "/" in part:
        raise _invalid(name, "an extended resource name has exactly one '/'")
    if not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix):
        raise _invalid(name, f"prefix {prefix!r} is not a DNS subdomain (e.g. nvidia.com)")
    if prefix == "kubernetes.io" or prefix.endswith(".kubernetes.io"):
        raise _invalid(name, "the kubernetes.io domain is reserved; use nvidia.com or your own")
    if not 1 <= len(part) <= 63:
        raise _invalid(name, f"the name after '/' must be 1-63 characters (got {len(part)})")
    if not _NAME_PART.fullmatch(part):
        raise _invalid(
            name,
            "the name after '/' must start and end with a letter or digit and contain only "
            "letters, digits, '-', '_' and '.'",
        )
    return full


def check_pattern(pattern: str) -> str:
    """A `resources` pattern: a glob whose only wildcard is `*`, matched against the whole name."""
    if not pattern:
        raise PydanticCustomError("pattern", "{detail}", {"detail": "the pattern is empty"})
    bad = sorted(set(pattern) & set("?[]"))
    if bad:
        raise PydanticCustomError(
            "pattern",
            "{detail}",
            {"detail": f"{pattern!r}: only '*' is a wildcard here (found {''.join(bad)})"},
        )
    return pattern


@lru_cache(maxsize=256)
def _glob_regex(pattern: str) -> re.Pattern[str]:
    return re.compile("^" + ".*".join(re.escape(part) for part in pattern.split("*")) + "$")


def glob_matches(pattern: str, text: str) -> bool:
    """True when `text` matches `pattern`, a glob whose only wildcard is `*`, anchored at both
    ends: the reference plugin's ResourcePattern, used for resource patterns and product globs."""
    return _glob_regex(pattern).match(text) is not None
