"""The pipeline's Kubernetes side: one API client, and the config source the options ask for.

The client is made once, only when a feature needs the API (`--node-name` for the config label
and node status, `--config-map` for the config), from the in-cluster service account or
`KUBECONFIG`. The config source is the mounted file/directory (`--config`), the ConfigMap read
through the API (`--config-map`, with `--config` as its fallback), or neither (the defaults).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from sharing_plugin.daemon.node.options import SourceOptions
from sharing_plugin.sources.filewatch import ConfigSource
from sharing_plugin.sources.update import ConfigUpdate, Trigger

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator

    from lightkube import AsyncClient

log = logging.getLogger(__name__)


class ConfigFeed(Protocol):
    """What the daemon needs of a config source (the mounted one or the API's)."""

    async def start(self) -> ConfigUpdate: ...

    def updates(self) -> AsyncGenerator[ConfigUpdate, None]: ...

    def trigger(self, trigger: Trigger) -> None: ...

    def stop(self) -> None: ...


def api_client(options: SourceOptions) -> AsyncClient | None:
    """The client for the features `options` turn on; None without credentials (logged)."""
    from sharing_plugin.sources.kube import client_from_environment

    client = client_from_environment()
    if client is None:
        log.warning(
            "no Kubernetes credentials (no in-cluster service account, no KUBECONFIG): "
            "the node label and node status are off%s",
            ", and the ConfigMap is read from its mounted copy only"
            if options.config_map is not None
            else "",
        )
    return client


def config_feed(
    options: SourceOptions,
    client: AsyncClient | None,
    *,
    label_value: Callable[[], str | None],
    on_trouble: Callable[[str | None], None],
) -> ConfigFeed:
    mounted = (
        ConfigSource(
            options.config_path,
            requested_name=options.config_name,
            label_value=label_value,
            # A ConfigMap swap is four renames within a millisecond; 20 ms of quiet is one batch.
            debounce_ms=20,
            error_settle_ms=round(options.config_error_settle_s * 1000),
        )
        if options.config_path is not None or options.config_map is None or client is None
        else None
    )
    if options.config_map is None or client is None:
        assert mounted is not None
        return mounted
    from sharing_plugin.sources.apiconfig import ApiConfigSource

    namespace, name = options.config_map
    return ApiConfigSource(
        client,
        namespace,
        name,
        requested_name=options.config_name,
        label_value=label_value,
        fallback=mounted,
        on_trouble=on_trouble,
    )
