"""Constants of the kubelet plugin registration and DRA APIs, which kubelet publishes in Go only.

Hand-written next to the generated code (k8s.io/kubelet pluginregistration/v1 constants.go, the
`DRAPluginService` constants of dra/v1beta1 and dra/v1, and dra-health/v1alpha1's
`DRAResourceHealthService`).
"""

from __future__ import annotations

from typing import Final

# PluginInfo.type of a DRA kubelet plugin.
DRA_PLUGIN_TYPE: Final = "DRAPlugin"

# PluginInfo.supported_versions entries: the gRPC services the plugin serves on its endpoint.
# The kubelet picks the newest it knows (1.34+: v1; 1.32-1.33: v1beta1).
V1_SERVICE: Final = "v1.DRAPlugin"
V1BETA1_SERVICE: Final = "v1beta1.DRAPlugin"
SUPPORTED_SERVICES: Final = (V1_SERVICE, V1BETA1_SERVICE)
# Listed too by a plugin that serves device health on its endpoint. A 1.36 kubelet with
# ResourceHealthStatus on opens the stream on every plugin; later ones open it where listed.
HEALTH_V1ALPHA1_SERVICE: Final = "v1alpha1.DRAResourceHealth"

# Directories inside the kubelet's root: the plugin watcher's, and the plugins' own.
PLUGINS_REGISTRY_DIR: Final = "plugins_registry"
PLUGINS_DIR: Final = "plugins"

# Socket names as the kubelet's own helper library makes them with its RollingUpdate option:
# `<driver>-<instance>-reg.sock` in plugins_registry/, `dra-<instance>.sock` in
# plugins/<driver>/; without an instance (earlier releases): `<driver>-reg.sock`, `dra.sock`.
REGISTRATION_SOCKET_SUFFIX: Final = "-reg.sock"
DRA_SOCKET_PREFIX: Final = "dra"
SOCKET_SUFFIX: Final = ".sock"
