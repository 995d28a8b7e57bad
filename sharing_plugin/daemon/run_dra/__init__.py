"""`sharing-plugin run-dra`: the node pipeline's plans published as ResourceSlices and served as a
DRA kubelet plugin (claims prepared, dynamic MIG made, conflicts with `run` refused)."""
