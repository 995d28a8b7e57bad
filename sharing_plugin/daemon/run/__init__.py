"""`sharing-plugin run`: the node pipeline's plans served to the kubelet as device plugin
resources, with the MPS gate and per-pod usage beside them."""
