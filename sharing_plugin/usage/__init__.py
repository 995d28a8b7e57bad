"""Per-pod GPU usage, pure: NVML's processes attributed to pods and set against their shares.

Values in `model`, the cgroup text parser in `cgroup`, the attribution in `report`, over-share
detection in `overshare`. The adapters read the node (NVML, `/proc`, the API, PodResources);
this package only computes.
"""
