"""The config from a ConfigMap read through the Kubernetes API, the mounted copy as fallback.

A mounted ConfigMap changes on the node only when the kubelet syncs the volume (its sync period
plus cache propagation: a minute or more, never for `subPath` mounts); read through the API, an
edit reaches the plugin within the watch's latency. This source follows the one ConfigMap
(`--config-map NAMESPACE/NAME`), selects the named config inside it exactly as for a mounted
one (node label, then `--config-name`, then `default`, then the only key), and hands out the
same `ConfigUpdate`s as the file source, so the daemon applies them on the same path.

Which copy serves, when a mounted copy is given too (`--config DIR`):
- the API's, whenever the API answers: the mount is only ever a late copy of it;
- the mounted one at start while the API does not answer;
- while the API stays unreachable, the copy that changed last: a mount that changes after the
  API went away is newer than the API's last copy, one that does not change is not, so the
  plugin never flaps between them; the API's copy takes over again once it answers.
Errors point at the ConfigMap key and the line in it: `NAMESPACE/NAME[KEY]:LINE:COL: ...`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from sharing_plugin.config.loader import NamedConfigs, parse_config
from sharing_plugin.config.selection import select
from sharing_plugin.errors import ConfigError, KubeApiError, Problem
from sharing_plugin.kit.tasks import TaskOwner
from sharing_plugin.sources.filewatch import ConfigSource
from sharing_plugin.sources.kube import WATCH_TIMEOUT_S, ObjectFollower, ObjectRef
from sharing_plugin.sources.update import ConfigUpdate, Trigger, TriggeredSource, fingerprint

if TYPE_CHECKING:
    from lightkube import AsyncClient

__all__ = ["ApiConfigSource", "parse_config_map_ref"]

log = logging.getLogger(__name__)

START_TIMEOUT_S = 5.0


def parse_config_map_ref(value: str) -> tuple[str, str]:
    """`NAMESPACE/NAME` -> (namespace, name); ValueError with what to write otherwise."""
    namespace, sep, name = value.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise ValueError(f"--config-map must be NAMESPACE/NAME (got {value!r})")
    return namespace, name


class ApiConfigSource(TriggeredSource):
    """Follows one ConfigMap through the API (see the module doc)."""

    def __init__(
        self,
        client: AsyncClient,
        namespace: str,
        name: str,
        *,
        requested_name: str | None = None,
        label_value: Callable[[], str | None] | None = None,
        fallback: ConfigSource | None = None,
        on_trouble: Callable[[str | None], None] = lambda _: None,
        start_timeout_s: float = START_TIMEOUT_S,
        watch_timeout_s: tuple[int, int] = WATCH_TIMEOUT_S,
    ) -> None:
        from lightkube.resources.core_v1 import ConfigMap

        self.namespace, self.name = namespace, name
        self._requested_name = requested_name
        self._label_value = label_value or (lambda: None)
        self._fallback = fallback
        self._on_trouble = on_trouble
        self._start_timeout_s = start_timeout_s
        self.follower = ObjectFollower(
            client,
            ObjectRef(ConfigMap, name, namespace),
            on_object=self._api_object,
            on_trouble=self._api_trouble,
            watch_timeout_s=watch_timeout_s,
        )
        self._data: dict[str, str] | None = None  # the API's last copy; None: none seen yet
        self._exists = True
        self._api_ok = False
        self._serving_mounted = False
        self._mounted: ConfigUpdate | None = None  # the mounted copy's last outcome
        self.trouble: str | None = None  # the API's current problem, for /status
        self._last: tuple[object, ...] | None = None
        super().__init__()

    @property
    def label(self) -> str:
        return f"{self.namespace}/{self.name}"

    async def start(self) -> ConfigUpdate:
        """The config to start with: the API's copy, or the mounted one if the API does not
        answer within the start timeout."""
        try:
            async with asyncio.timeout(self._start_timeout_s):
                obj = await self.follower.fetch()
        except (KubeApiError, TimeoutError) as exc:
            self._api_trouble(str(exc) or f"no answer within {self._start_timeout_s:g} s")
            if self._fallback is not None:
                log.warning("ConfigMap %s: %s; starting from the mounted copy", self.label, exc)
                self._serving_mounted = True
                self._mounted = self._fallback.read(Trigger.START_API_UNREACHABLE)
                return self._remember(self._mounted)
            log.warning("ConfigMap %s: %s", self.label, self.trouble)
            error = ConfigError([Problem("", f"ConfigMap {self.label}: {self.trouble}")])
            # Nothing to serve until the API answers: the watch brings the first copy.
            self._api_ok = False
            return self._remember(ConfigUpdate(None, None, error, Trigger.START))
        self._api_ok = True
        self._take(obj)
        return self._remember(self._read(Trigger.START))

    async def updates(self) -> AsyncGenerator[ConfigUpdate, None]:
        """Every new outcome until `stop()`: API edits, label changes, and the mounted copy's
        changes while the API does not answer."""
        tasks = TaskOwner("configmap")
        tasks.spawn(self.follower.run(), name=self.label)
        if self._fallback is not None:
            tasks.spawn(self._follow_mounted(), name="mounted")
        try:
            while (triggers := await self._woken()) is not None:
                if not triggers:
                    continue
                update = self._read(triggers[-1])
                forced = any(t.forced for t in triggers)
                if not forced and fingerprint(update) == self._last:
                    continue
                yield self._remember(update)
        finally:
            await tasks.close()
            if self._fallback is not None:
                self._fallback.stop()

    # --- what the two copies say --------------------------------------------------------------

    def _api_object(self, obj: Any | None) -> None:
        was_ok, self._api_ok = self._api_ok, True
        before = (self._exists, self._data)
        self._take(obj)
        if before == (self._exists, self._data) and was_ok and not self._serving_mounted:
            return
        if self._serving_mounted:
            log.info("ConfigMap %s: the API answers again; serving its copy", self.label)
        self._serving_mounted = False
        self._triggers.append(Trigger.CONFIGMAP_CHANGED)
        self._wake.set()

    def _api_trouble(self, text: str | None) -> None:
        if text == self.trouble:
            return
        self.trouble = text
        if text is not None:
            self._api_ok = False
        self._on_trouble(text)

    def _take(self, obj: Any | None) -> None:
        self._exists = obj is not None
        self._data = dict(obj.data or {}) if obj is not None else {}

    async def _follow_mounted(self) -> None:
        assert self._fallback is not None
        async with contextlib.aclosing(self._fallback.updates()) as updates:
            async for update in updates:
                self._mounted = update
                if self._api_ok:
                    continue  # the API's copy is the truth; the mount only lags behind it
                if not self._serving_mounted:
                    log.warning(
                        "ConfigMap %s: the API does not answer and the mounted copy changed; "
                        "serving the mounted copy",
                        self.label,
                    )
                self._serving_mounted = True
                self._triggers.append(Trigger.MOUNT_CHANGED)
                self._wake.set()

    def _read(self, trigger: Trigger) -> ConfigUpdate:
        if self._serving_mounted and self._fallback is not None:
            if not trigger.forced and self._mounted is not None:
                return replace(self._mounted, trigger=Trigger.MOUNT_CHANGED)
            return self._fallback.read(trigger)
        if not self._exists:
            problem = Problem("", f"ConfigMap {self.label} does not exist")
            return ConfigUpdate(None, None, ConfigError([problem]), trigger)
        try:
            configs = self._parse(self._data or {})
            name, loaded = select(configs, self._label_value(), self._requested_name)
        except ConfigError as exc:
            return ConfigUpdate(None, None, exc, trigger)
        return ConfigUpdate(name, loaded, None, trigger)

    def _parse(self, data: Mapping[str, str]) -> NamedConfigs:
        configs: NamedConfigs = {}
        problems: list[Problem] = []
        for key, text in data.items():
            try:
                configs[key] = parse_config(text, file=f"{self.label}[{key}]")
            except ConfigError as exc:
                problems.extend(exc.problems)
        if problems:
            raise ConfigError(problems)
        if not configs:
            raise ConfigError([Problem("", f"ConfigMap {self.label} has no data keys")])
        return configs

    def _remember(self, update: ConfigUpdate) -> ConfigUpdate:
        self._last = fingerprint(update)
        return update
