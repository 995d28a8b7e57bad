"""Just enough of the Kubernetes API to GET and WATCH one Node, over asyncio streams.

The plugin needs a single label of its own Node, so instead of a full Kubernetes client (a
large dependency, slow to import) it speaks HTTP/1.1 directly: one GET and one streaming WATCH
(JSON lines, usually chunked), with a bearer token or a client certificate. Credentials come
from the pod's service account or a KUBECONFIG file; exec plugins and OIDC are out of scope.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import ssl
import tempfile
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from sharing_plugin.errors import KubeApiError

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
REQUEST_TIMEOUT_S = 30.0
_MAX_EVENT = 16 * 1024 * 1024
# Ask for metadata only: a Node's status (images, conditions) is most of its size and changes
# with every heartbeat; an API server that does not offer this form sends the full object.
_ACCEPT = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
_HINTS = {
    401: "the token or client certificate was rejected; check the credentials",
    403: "grant the plugin's service account get, list and watch on nodes (deploy/rbac.yaml)",
    404: "no such node: check --node-name (usually the downward API's spec.nodeName)",
}


@dataclass
class _Response:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    status: int
    headers: dict[str, str]

    async def chunks(self, idle_s: float) -> AsyncIterator[bytes]:
        """The body as it arrives: chunked, Content-Length, or until the server closes."""
        read = self.reader
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size_line = await asyncio.wait_for(read.readline(), idle_s)
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    return
                if size > _MAX_EVENT:
                    raise KubeApiError(f"response chunk of {size} bytes is too large")
                data = await asyncio.wait_for(read.readexactly(size + 2), idle_s)
                yield data[:-2]
        elif "content-length" in self.headers:
            length = int(self.headers["content-length"])
            if length > _MAX_EVENT:
                raise KubeApiError(f"response of {length} bytes is too large")
            yield await asyncio.wait_for(read.readexactly(length), idle_s)
        else:
            while data := await asyncio.wait_for(read.read(65536), idle_s):
                yield data

    async def body(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks(REQUEST_TIMEOUT_S)])

    def close(self) -> None:
        self.writer.close()


class KubeClient:
    """GET and WATCH of Nodes against one API server.

    A token file is re-read on every request because kubelet rotates service account tokens
    (bound tokens expire after an hour).
    """

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        token_file: Path | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise KubeApiError(f"API server URL {base_url!r} must be http(s)://host[:port]")
        self.base_url = base_url.rstrip("/")
        self._host = parts.hostname
        self._tls = parts.scheme == "https"
        self._port = parts.port or (443 if self._tls else 80)
        self._prefix = parts.path.rstrip("/")
        self._token = token
        self._token_file = token_file
        self._ssl: ssl.SSLContext | None = None
        if self._tls:
            self._ssl = ssl_context or ssl.create_default_context()

    @classmethod
    def from_environment(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        service_account_dir: Path = SERVICE_ACCOUNT_DIR,
    ) -> KubeClient | None:
        """In-cluster service account, else the KUBECONFIG file; None when neither is there."""
        env = os.environ if environ is None else environ
        host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
        token_file = service_account_dir / "token"
        if host and port and token_file.is_file():
            ca = service_account_dir / "ca.crt"
            context = ssl.create_default_context(cafile=str(ca) if ca.is_file() else None)
            host = f"[{host}]" if ":" in host else host
            return cls(f"https://{host}:{port}", token_file=token_file, ssl_context=context)
        for name in env.get("KUBECONFIG", "").split(os.pathsep):
            if name and Path(name).is_file():
                return cls.from_kubeconfig(Path(name))
        return None

    @classmethod
    def from_kubeconfig(cls, path: Path) -> KubeClient:
        """The current context of a kubeconfig file: server, CA, and a token or client cert."""
        import yaml

        where = f"kubeconfig {path}"
        try:
            doc = yaml.safe_load(path.read_text())
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            # PyYAML's report spans several lines; a start-up error is one line.
            raise KubeApiError(f"{where}: cannot read: {' '.join(str(exc).split())}") from None
        if not isinstance(doc, dict):
            raise KubeApiError(f"{where}: not a kubeconfig (expected a mapping)")
        context_name = doc.get("current-context")
        context = _named(doc, "contexts", context_name, where).get("context") or {}
        cluster = _named(doc, "clusters", context.get("cluster"), where).get("cluster") or {}
        user = _named(doc, "users", context.get("user"), where).get("user") or {}
        if "exec" in user or "auth-provider" in user:
            raise KubeApiError(
                f"{where}: user {context.get('user')!r} uses an exec/auth-provider plugin, "
                "which is not supported; use a token or a client certificate"
            )
        base = path.parent
        server = cluster.get("server")
        if not isinstance(server, str):
            raise KubeApiError(f"{where}: cluster {context.get('cluster')!r} has no server")
        context_ssl = None
        if server.startswith("https"):
            context_ssl = ssl.create_default_context(
                cafile=_file(base, cluster.get("certificate-authority")),
                cadata=_decoded(cluster.get("certificate-authority-data")),
            )
            if cluster.get("insecure-skip-tls-verify"):
                context_ssl.check_hostname = False
                context_ssl.verify_mode = ssl.CERT_NONE
            _load_client_cert(context_ssl, base, user, where)
        token_file = _file(base, user.get("tokenFile"))
        return cls(
            server,
            token=user.get("token"),
            token_file=Path(token_file) if token_file else None,
            ssl_context=context_ssl,
        )

    async def get_node(self, name: str) -> dict[str, Any]:
        path = f"/api/v1/nodes/{quote(name, safe='')}"
        response = await self._request(path)
        try:
            return _json_object(await response.body(), path)
        finally:
            response.close()

    async def watch_node(
        self, name: str, resource_version: str, *, timeout_s: int = 300
    ) -> AsyncIterator[dict[str, Any]]:
        """Watch events of one Node after `resource_version`, until the server ends the watch.

        The server ends it after `timeout_s`; a connection silent for longer than that (a dead
        peer TCP has not noticed) is an error.
        """
        path = (
            "/api/v1/nodes?fieldSelector="
            + quote(f"metadata.name={name}", safe="")
            + f"&watch=true&resourceVersion={quote(resource_version, safe='')}"
            + f"&allowWatchBookmarks=true&timeoutSeconds={timeout_s}"
        )
        response = await self._request(path)
        buffer = b""
        try:
            async for chunk in response.chunks(timeout_s + 30.0):
                buffer += chunk
                if len(buffer) > _MAX_EVENT:
                    raise KubeApiError(f"watch {path}: an event is over {_MAX_EVENT} bytes")
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield _json_object(line, path)
            if buffer.strip():
                yield _json_object(buffer, path)
        finally:
            response.close()

    async def _request(self, path: str) -> _Response:
        token = self._token
        if self._token_file is not None:
            try:
                token = self._token_file.read_text().strip()
            except OSError as exc:
                raise KubeApiError(f"cannot read token {self._token_file}: {exc}") from exc
        async with asyncio.timeout(REQUEST_TIMEOUT_S):
            reader, writer = await asyncio.open_connection(
                self._host,
                self._port,
                ssl=self._ssl,
                server_hostname=self._host if self._tls else None,
            )
            head = [
                f"GET {self._prefix}{path} HTTP/1.1",
                f"Host: {self._host}:{self._port}",
                f"Accept: {_ACCEPT}",
                "User-Agent: sharing-plugin",
                "Connection: close",
            ]
            if token:
                head.append(f"Authorization: Bearer {token}")
            writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
            try:
                response = await _response_head(reader, writer)
                if response.status != 200:
                    raise KubeApiError(
                        _failure(path, response.status, await response.body()),
                        code=response.status,
                    )
            except BaseException:
                writer.close()
                raise
        return response


async def _response_head(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> _Response:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError as exc:
        raise KubeApiError("response headers are too large") from exc
    lines = head.decode("latin-1").split("\r\n")
    try:
        status = int(lines[0].split(" ", 2)[1])
    except (IndexError, ValueError) as exc:
        raise KubeApiError(f"not an HTTP response: {lines[0][:80]!r}") from exc
    headers = {}
    for line in lines[1:]:
        key, sep, value = line.partition(":")
        if sep:
            headers[key.strip().lower()] = value.strip()
    return _Response(reader, writer, status, headers)


def _failure(path: str, status: int, body: bytes) -> str:
    message = body.decode("utf-8", "replace").strip()[:300]
    try:
        parsed = json.loads(body)
        if isinstance(parsed, dict) and "message" in parsed:
            message = str(parsed["message"])
    except ValueError:
        pass
    hint = _HINTS.get(status)
    return f"GET {path}: HTTP {status}: {message}" + (f" ({hint})" if hint else "")


def _json_object(data: bytes, path: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError as exc:
        raise KubeApiError(f"{path}: the API server sent invalid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise KubeApiError(f"{path}: the API server sent {type(value).__name__}, not an object")
    return value


def _named(doc: dict[str, Any], section: str, name: object, where: str) -> dict[str, Any]:
    for entry in doc.get(section) or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            return entry
    raise KubeApiError(f"{where}: no entry {name!r} in {section}")


def _file(base: Path, name: object) -> str | None:
    return str(base / name) if isinstance(name, str) and name else None


def _decoded(data: object) -> str | None:
    return base64.b64decode(data).decode() if isinstance(data, str) and data else None


def _load_client_cert(
    context: ssl.SSLContext, base: Path, user: dict[str, Any], where: str
) -> None:
    cert, key = _file(base, user.get("client-certificate")), _file(base, user.get("client-key"))
    cert_data, key_data = user.get("client-certificate-data"), user.get("client-key-data")
    if cert_data and key_data:
        # ssl loads certificates only from files: stage them in a private directory.
        with tempfile.TemporaryDirectory(prefix="sharing-plugin-") as tmp:
            cert, key = os.path.join(tmp, "client.crt"), os.path.join(tmp, "client.key")
            for name, data in ((cert, cert_data), (key, key_data)):
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as out:
                    out.write(base64.b64decode(data))
            context.load_cert_chain(cert, key)
    elif cert and key:
        try:
            context.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as exc:
            raise KubeApiError(f"{where}: cannot load the client certificate: {exc}") from exc
