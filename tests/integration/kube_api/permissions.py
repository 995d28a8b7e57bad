"""Who may do what: bearer tokens mapped to (verb, resource) pairs, and the 403 that
kube-apiserver's RBAC authorizer answers when a pair is missing."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

from .status import StatusError, status

DEFAULT_USER = "system:serviceaccount:kube-system:sharing-plugin"

VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
RESOURCES = (
    "nodes",
    "configmaps",
    "events",
    "pods",
    # resource.k8s.io (DRA)
    "resourceslices",
    "resourceclaims",
    "deviceclasses",
)


class Permissions(frozenset[tuple[str, str]]):
    """A frozenset of (verb, resource) pairs, plus the user name a 403 message names."""

    user: str

    def __new__(
        cls, pairs: Iterable[tuple[str, str]] = (), *, user: str = DEFAULT_USER
    ) -> Permissions:
        self = super().__new__(cls, pairs)
        self.user = user
        return self


def permissions(*pairs: tuple[str, str], user: str = DEFAULT_USER) -> Permissions:
    """permissions(("get", "nodes"), ("watch", "configmaps"), ...)"""
    for verb, resource in pairs:
        if verb not in VERBS or resource not in RESOURCES:
            raise ValueError(f"unknown permission {(verb, resource)!r}")
    return Permissions(pairs, user=user)


ALL_PERMISSIONS = Permissions(itertools.product(VERBS, RESOURCES))


def authorize(
    perms: Permissions | None,
    verb: str,
    resource: str,
    *,
    group: str,
    namespace: str | None,
    name: str | None,
) -> None:
    """Raise the 403 kube-apiserver answers when `perms` lack (verb, resource); None: anyone."""
    if perms is None or (verb, resource) in perms:
        return
    user = getattr(perms, "user", DEFAULT_USER)
    where = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
    reason = f'User "{user}" cannot {verb} resource "{resource}" in API group "{group}" {where}'
    shown = f"{resource}.{group}" if group else resource
    subject = f'{shown} "{name}"' if name else shown
    details: dict[str, Any] = {"group": group, "kind": resource} if group else {"kind": resource}
    if name:
        details = {"name": name, **details}
    raise StatusError(status(403, "Forbidden", f"{subject} is forbidden: {reason}", details))
