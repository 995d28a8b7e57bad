"""Kubelet DRA plugin API: our .proto files, the code generated from them (do not edit), constants.

pluginregistration/v1 (the plugin watcher's Registration service), dra/v1beta1 (Kubernetes
1.32-1.33), dra/v1 (1.34+) and dra_health/v1alpha1 (the kubelet's dra-health API: device health
streamed to the kubelet) live in separate directories so that each api.proto is registered in
the protobuf descriptor pool under its own path. Regenerate with
`make api` (`scripts/generate_api.py`, for both API trees).
"""
