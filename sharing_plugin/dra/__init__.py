"""The DRA kubelet plugin adapter: registration, the DRA gRPC services, CDI specs, checkpoint,
and the node's ResourceSlices through the Kubernetes API (docs/contract.md, "DRA mode")."""
