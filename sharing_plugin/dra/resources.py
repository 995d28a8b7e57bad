"""resource.k8s.io through lightkube: generic resources per version, discovery, API errors.

lightkube ships typed models for some resource.k8s.io versions and not others, and which ones
depends on the installed lightkube-models; generic resources work for every version a server
serves, so the plugin speaks to v1 and v1beta1 the same way, as plain dictionaries in the API's
own shape. Which version to speak is asked of the server (`GET /apis/resource.k8s.io`): the
newest one the plugin knows that the server serves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sharing_plugin.errors import KubeApiError
from sharing_plugin.views.dra_api import API_VERSIONS, RESOURCE_GROUP

if TYPE_CHECKING:
    from lightkube import AsyncClient

_PLURALS = {
    "ResourceSlice": ("resourceslices", False),
    "ResourceClaim": ("resourceclaims", True),
    "DeviceClass": ("deviceclasses", False),
}


def resource_class(api_version: str, kind: str) -> Any:
    """The lightkube generic resource class of `kind` in `api_version` (made once, then reused)."""
    from lightkube.core.resource_registry import resource_registry
    from lightkube.generic_resource import create_global_resource, create_namespaced_resource

    existing = resource_registry.get(api_version, kind)
    if existing is not None:
        return existing
    group, _, version = api_version.partition("/")
    plural, namespaced = _PLURALS[kind]
    create = create_namespaced_resource if namespaced else create_global_resource
    return create(group, version, kind, plural)


def generic(api_version: str, document: dict[str, Any]) -> Any:
    """An API document as an instance of its generic resource class, ready to send."""
    return resource_class(api_version, str(document["kind"])).from_dict(document)


async def status_of(exc: BaseException) -> tuple[int, str] | None:
    """(HTTP code, the API server's message) of a refused request; None for other failures."""
    import httpx2
    from lightkube import ApiError

    if isinstance(exc, ApiError):
        return exc.status.code or 0, exc.status.message or ""
    if isinstance(exc, httpx2.HTTPStatusError):
        message = ""
        try:
            await exc.response.aread()
            body = exc.response.json()
            message = str(body.get("message", "")) if isinstance(body, dict) else ""
        except Exception:  # not a Status: the code says enough
            pass
        return exc.response.status_code, message
    return None


async def api_error(exc: BaseException, doing: str, verb: str, plural: str) -> KubeApiError:
    """`exc` as one line for an admin; a 403 names the permission to grant."""
    status = await status_of(exc)
    if status is None:
        return KubeApiError(f"{doing}: {type(exc).__name__}: {exc}")
    code, message = status
    if code == 403:
        return KubeApiError(
            f"{doing}: forbidden (403): {message}; grant the plugin's service account {verb} on "
            f"{plural} in API group {RESOURCE_GROUP}",
            code=code,
        )
    return KubeApiError(f"{doing}: HTTP {code}: {message}", code=code)


async def discover_version(client: AsyncClient) -> str:
    """The resource.k8s.io version to speak: the newest of API_VERSIONS the server serves.

    Raises KubeApiError when the server serves none of them (DRA off, or too old a cluster).
    """
    # lightkube has no discovery call; its httpx client (which carries the credentials and the
    # TLS settings of the kubeconfig or service account) is asked directly.
    http = client._client._client
    try:
        response = await http.get(f"/apis/{RESOURCE_GROUP}")
    except Exception as exc:
        raise KubeApiError(f"asking the API server for {RESOURCE_GROUP}: {exc}") from exc
    served: set[str] = set()
    if response.status_code == 200:
        body = response.json()
        served = {str(v.get("groupVersion")) for v in body.get("versions", ())}
    elif response.status_code != 404:
        raise KubeApiError(
            f"asking the API server for {RESOURCE_GROUP}: HTTP {response.status_code}",
            code=response.status_code,
        )
    for version in API_VERSIONS:
        if version in served:
            return version
    raise KubeApiError(
        f"the API server serves none of {', '.join(API_VERSIONS)} (it serves "
        f"{', '.join(sorted(served)) or 'no version of the group'}): DRA needs Kubernetes 1.32 "
        "or later with the resource.k8s.io API enabled"
    )
