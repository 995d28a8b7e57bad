"""A fake kube-apiserver for the API calls a GPU device plugin makes, served over real HTTP.

`FakeKubeApi` listens on 127.0.0.1 (plain HTTP/1.1, keep-alive, chunked watch streams) and
keeps objects the way kube-apiserver does where a client can tell. One module per part:

    server       listening, HTTP requests, bearer tokens, routing to an API group
    core         Nodes, ConfigMaps, Events (`/api/v1`): get, list, watch, patch, create
    dra          resource.k8s.io (`/apis`): ResourceSlices, ResourceClaims, DeviceClasses
    dra_schema   their conversion between v1 and v1beta1, validation, discovery
    store        objects, the global resourceVersion, history, the open watches
    watch        watch streams: resume from a resourceVersion, 410 Gone, bookmarks, timeouts
    permissions  per-token (verb, resource) permissions and kube-apiserver's 403
    validation   label, annotation and name rules (422)
    selectors    merge patches, label and field selectors
    status       `Status` answers (404, 409, 422, ...)
    wire         HTTP/1.1 bodies, JSON answers, chunked streams

Tests drive it from the side: change objects (`put_node`, `set_node_label`, `put_configmap`, ...),
end watches cleanly or drop their connections (`close_watches`), answer the next watch with 410
Gone (`expire_next_watch`), forget history (`compact`, or a window of `watch_window` changes),
send BOOKMARKs (`send_bookmarks`), stop and restart listening (`down`/`up`), restart as an API
server does (`restart`: connections dropped, watch cache empty), and read what the client asked
(`requests`).
"""

from .permissions import ALL_PERMISSIONS, Permissions, permissions
from .server import FakeKubeApi, Request

__all__ = [
    "ALL_PERMISSIONS",
    "FakeKubeApi",
    "Permissions",
    "Request",
    "permissions",
]
