"""Constants of the kubelet device plugin API (k8s.io/kubelet deviceplugin/v1beta1 constants.go).

Hand-written next to the generated code because kubelet publishes them in Go only.
"""

from __future__ import annotations

from typing import Final

# The API version a plugin sends in RegisterRequest.version; the only one kubelet supports.
VERSION: Final = "v1beta1"
SUPPORTED_VERSIONS: Final = ("v1beta1",)

# Device.health values. Kubelet compares with "Healthy" by exact match: anything else is unhealthy.
HEALTHY: Final = "Healthy"
UNHEALTHY: Final = "Unhealthy"

# File names inside <kubelet-dir>/device-plugins/ and <kubelet-dir>/pod-resources/.
DEVICE_PLUGINS_DIR: Final = "device-plugins"
POD_RESOURCES_DIR: Final = "pod-resources"
KUBELET_SOCKET: Final = "kubelet.sock"
# Kubelet's device manager checkpoint; the only file kubelet keeps in device-plugins on restart.
KUBELET_CHECKPOINT: Final = "kubelet_internal_checkpoint"

# Kubelet's gRPC clients keep grpc-go's default receive limit, 4 MiB per message.
KUBELET_MAX_RECEIVE_MESSAGE_BYTES: Final = 4 * 1024 * 1024
