"""Following one Kubernetes object through the API: LIST it, then WATCH it, forever.

The plugin follows two objects: its Node (for the config label) and, with `--config-map`, the
ConfigMap holding its configs. Both need the same watch discipline as client-go's reflector:

- LIST the one object (a field selector on its name) for the state now and the list's
  resourceVersion, then WATCH from that version with the same selector, BOOKMARKs allowed, a
  server-side timeout spread with jitter so a fleet of nodes does not reconnect in lockstep,
  and a client-side guard a little longer than it (a connection that died without a FIN would
  otherwise hang the watch for ever).
- The resume point is always the newest version seen: the list's, then each event's and each
  BOOKMARK's (a BOOKMARK carries the server's version past changes this watch does not see).
  Never the object's own resourceVersion: an object nobody edited for a while is older than
  the watch cache's window (at once after an API server restart), and a watch from it gets
  `410 Gone` for ever. The end of a watch (server timeout) resumes from the newest version;
  `410 Gone` lists again at once (a second one in a row backs off).
- An object that does not exist is an empty list: reported once, and watched for.
- `fetch()` is one GET: the state at start-up, before the follower runs.
- Failures back off (0.2 s doubling to 10 s, with jitter); nothing here raises for API trouble.
  `401`/`403` are logged once per kind as one line that names the missing permission, and
  every trouble is reported through `on_trouble` (None once the object is seen again), so the
  daemon can show it in /status.

lightkube (typed, async, kubeconfig with exec plugins, in-cluster service account) is imported
only when a feature needs the API: a node without `--node-name` or `--config-map` never loads it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, cast

from sharing_plugin.errors import KubeApiError

if TYPE_CHECKING:
    import httpx2 as httpx
    from lightkube import AsyncClient, KubeConfig

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
BACKOFF_S = (0.2, 10.0)
WATCH_TIMEOUT_S = (300, 600)  # server-side timeout of one watch, picked in this range
_GUARD_S = 30  # client-side: a watch silent for its timeout plus this long is dead
_CONNECT_S = 10.0  # connecting and sending a watch request (reading its stream has no limit)


def client_from_environment(
    environ: Mapping[str, str] | None = None,
    *,
    service_account_dir: Path = SERVICE_ACCOUNT_DIR,
) -> AsyncClient | None:
    """A client with the in-cluster service account, else `KUBECONFIG` (or ~/.kube/config);
    None when there is neither. Exec-plugin credentials (EKS, GKE, AKS) work as in kubectl."""
    found = _credentials(environ, service_account_dir)
    return None if found is None else _client(*found)


def http_from_environment(
    environ: Mapping[str, str] | None = None,
    *,
    timeout_s: float,
    service_account_dir: Path = SERVICE_ACCOUNT_DIR,
) -> httpx.AsyncClient | None:
    """An HTTP client for the API server (its base URL, CA and credentials found as the typed
    client's are), for paths the typed client has no call for (a pod's proxy); None when there
    are no credentials."""
    from lightkube.config import client_adapter

    found = _credentials(environ, service_account_dir)
    if found is None:
        return None
    config = _config(*found).get()
    if config is None:
        raise KubeApiError(f"kubeconfig {found[0]}: no current context")
    params = client_adapter.ConnectionParams(timeout=httpx_timeout(timeout_s))
    return client_adapter.AsyncClient(config, params)


def httpx_timeout(seconds: float) -> httpx.Timeout:
    import httpx2 as httpx

    return httpx.Timeout(seconds)


def _credentials(
    environ: Mapping[str, str] | None, service_account_dir: Path
) -> tuple[Path, bool] | None:
    env = os.environ if environ is None else environ
    if (service_account_dir / "token").is_file():
        source = service_account_dir
    elif env.get("KUBECONFIG"):
        source = Path(env["KUBECONFIG"].split(os.pathsep)[0])
    elif (default := Path.home() / ".kube" / "config").is_file():
        source = default
    else:
        return None
    return source, source == service_account_dir


def client_from_kubeconfig(path: str | Path) -> AsyncClient:
    """A client for the kubeconfig file at `path`."""
    return _client(Path(path), False)


def _client(source: Path, service_account: bool) -> AsyncClient:
    from lightkube import AsyncClient

    return AsyncClient(config=_config(source, service_account))


def _config(source: Path, service_account: bool) -> KubeConfig:
    from lightkube import KubeConfig

    try:
        if service_account:
            config = KubeConfig.from_service_account(source)
        else:
            config = KubeConfig.from_file(source)
    except Exception as exc:  # unreadable, not YAML, no current context, ...
        what = "service account" if service_account else "kubeconfig"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise KubeApiError(f"{what} {source}: cannot read: {first}") from exc
    return config


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """Which object to follow: `kind` is the lightkube resource class (Node, ConfigMap)."""

    kind: Any
    name: str
    namespace: str | None = None

    def describe(self) -> str:
        plural = self.kind._api_info.plural
        where = f" in namespace {self.namespace}" if self.namespace else ""
        return f"{plural} {self.name!r}{where}"


async def api_status(exc: BaseException) -> tuple[int, str] | None:
    """(HTTP code, the API server's message) of a refused request; None for other failures.

    lightkube raises `ApiError` (with the decoded Status) for plain requests, but a refused
    watch surfaces as httpx's `HTTPStatusError` with the Status still in the response body.
    """
    from lightkube import ApiError

    if isinstance(exc, ApiError):
        return exc.status.code or 0, exc.status.message or ""
    # lightkube's HTTP client raises its HTTPStatusError (it carries `response`) for a refused
    # watch; it is recognised by that, so the client's package is not imported here.
    response = getattr(exc, "response", None)
    code = getattr(response, "status_code", None)
    if response is None or not isinstance(code, int):
        return None
    message = ""
    try:
        await response.aread()
        body = response.json()
        message = str(body.get("message", "")) if isinstance(body, dict) else ""
    except Exception:  # a body that is not a Status (or is closed): the code says enough
        pass
    return code, message


def trouble_text(
    ref: ObjectRef, status: tuple[int, str] | None, exc: BaseException, verb: str = "get"
) -> str:
    """One line for an admin: what failed, and for 401/403 which permission is missing."""
    if status is None:
        return f"reading {ref.describe()}: {type(exc).__name__}: {exc}"
    code, message = status
    if code == 401:
        return f"reading {ref.describe()}: the API server refused the credentials (401): {message}"
    if code == 403:
        plural = ref.kind._api_info.plural
        said = message or f"cannot {verb} resource {plural!r}"
        return (
            f"reading {ref.describe()}: forbidden (403): {said}; grant the plugin's service "
            f"account {verb} on {plural}"
        )
    if code == 404:
        return f"{ref.describe()} does not exist (404)"
    return f"reading {ref.describe()}: HTTP {code}: {message}"


class ObjectFollower:
    """Calls `on_object` with every new state of one object (None: it does not exist)."""

    def __init__(
        self,
        client: AsyncClient,
        ref: ObjectRef,
        *,
        on_object: Callable[[Any | None], None],
        on_trouble: Callable[[str | None], None] = lambda _: None,
        watch_timeout_s: tuple[int, int] = WATCH_TIMEOUT_S,
        backoff_s: tuple[float, float] = BACKOFF_S,
    ) -> None:
        self._client = client
        self.ref = ref
        self._on_object = on_object
        self._on_trouble = on_trouble
        self._watch_timeout_s = watch_timeout_s
        self._backoff_s = backoff_s
        self._logged: set[int | str] = set()
        self._missing = False  # the last LIST or event said the object does not exist
        self._expired = 0  # 410 answers since the last watch that delivered anything
        self.watching = asyncio.Event()  # set while a watch is open
        self._verb = "get"  # what the follower was doing, to name a missing permission

    async def fetch(self) -> Any | None:
        """GET the object now; None when it does not exist. Raises KubeApiError."""
        try:
            return await self._get()
        except Exception as exc:
            status = await api_status(exc)
            if status is not None and status[0] == 404:
                return None
            code = status[0] if status is not None else None
            raise KubeApiError(trouble_text(self.ref, status, exc), code=code) from None

    async def _get(self) -> Any:
        if self.ref.namespace is None:
            return await self._client.get(self.ref.kind, self.ref.name)
        return await self._client.get(self.ref.kind, self.ref.name, namespace=self.ref.namespace)

    async def run(self) -> None:
        """Follow the object until cancelled."""
        delay = self._backoff_s[0]
        while True:
            try:
                await self._list_and_watch()
            except Exception as exc:  # refusals, connection refused/reset, bad answers
                status = await api_status(exc)
                code: int | str = status[0] if status is not None else type(exc).__name__
                text = trouble_text(self.ref, status, exc, self._verb)
            finally:
                self.watching.clear()
            if code == 410:
                self._expired += 1
                if self._expired == 1:
                    # The version to resume from has left the server's window (compaction, a
                    # restarted API server): the state is read again at once, which is not
                    # trouble. A second 410 before anything arrived is: it backs off.
                    log.info("%s; listing again", text)
                    continue
            self._report(code, text)
            await asyncio.sleep(delay * random.uniform(0.8, 1.2))
            delay = min(delay * 2, self._backoff_s[1])

    def _report(self, code: int | str, text: str) -> None:
        # Permission and credential problems do not fix themselves: log them once (until
        # the object is seen again); transient ones at every try, at a lower level.
        if code in (401, 403):
            if code not in self._logged:
                log.error("%s", text)
                self._logged.add(code)
        else:
            log.warning("%s; retrying", text)
        self._on_trouble(text)

    async def _list_and_watch(self) -> NoReturn:
        """LIST the object, then WATCH from the list's version, resuming each watch the server
        ends from the newest version seen, until a watch fails (410 Gone included)."""
        self._verb = "list"
        listing = self._client.list(
            self.ref.kind,
            namespace=self.ref.namespace,
            fields={"metadata.name": self.ref.name},
        )
        found = [obj async for obj in listing]
        version = listing.resourceVersion
        if found:
            self._seen(found[0])
        else:
            self._absent()
        self._verb = "watch"
        while True:
            version = await self._watch(version)

    async def _watch(self, version: str) -> str:
        """One WATCH from `version`; the newest version it saw once the server ended it."""
        import httpx2
        from lightkube import ApiError
        from lightkube.models.meta_v1 import Status

        timeout = random.randint(*self._watch_timeout_s)
        # lightkube's own watch() cannot ask for BOOKMARKs, and resumes a watch the server
        # ended by itself; its request builder and HTTP client can, with the resume kept here.
        api = self._client._client
        request = api.prepare_request(
            "list",
            res=self.ref.kind,
            namespace=self.ref.namespace,
            watch=True,
            params={
                "fieldSelector": f"metadata.name={self.ref.name}",
                "resourceVersion": version,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": timeout,
            },
        )
        http = api._client
        sent = http.build_request(
            request.method,
            request.url,
            params=request.params,
            timeout=httpx2.Timeout(_CONNECT_S, read=None),
        )
        # Past the server's timeout plus a margin the watch is dropped and taken up again from
        # the same version: a connection that died without a word would hang it for ever.
        guard = asyncio.timeout(timeout + _GUARD_S)
        try:
            async with guard:
                response = await http.send(sent, stream=True)
                try:
                    if response.status_code >= 400:
                        await response.aread()  # the Status, for the message
                        response.raise_for_status()
                    self.watching.set()
                    async for line in response.aiter_lines():
                        if not line:
                            continue
                        event = json.loads(line)
                        kind, obj = event.get("type"), event.get("object") or {}
                        if kind == "ERROR":  # 410 Gone arrives so, inside a 200 stream
                            raise ApiError(status=cast(Status, Status.from_dict(obj)))
                        self._expired = 0
                        version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                        if kind == "DELETED":
                            self._absent()
                        elif kind in ("ADDED", "MODIFIED"):
                            self._seen(self.ref.kind.from_dict(obj))
                        # BOOKMARK: only the version moves (past changes this watch does not see)
                finally:
                    await response.aclose()
        except TimeoutError:
            if not guard.expired():
                raise
        self._expired = 0
        return version

    def _seen(self, obj: Any) -> None:
        if self._logged:
            log.info("%s is readable again", self.ref.describe())
            self._logged.clear()
        self._missing = False
        self._on_trouble(None)
        self._on_object(obj)

    def _absent(self) -> None:
        """The object does not exist (the LIST has no item, or it was deleted): say so once,
        and keep watching, which brings it when it is created."""
        text = f"{self.ref.describe()} does not exist (404)"
        self._on_object(None)
        if not self._missing:
            log.warning("%s; waiting for it to be created", text)
            self._missing = True
        self._on_trouble(text)
