"""Kubelet API: our .proto files, the code generated from them (do not edit), and constants.

deviceplugin/v1beta1 and podresources/v1 live in separate directories so that each api.proto is
registered in the protobuf descriptor pool under its own path. Regenerate with
`make api` (`scripts/generate_api.py`, for both API trees).
"""
