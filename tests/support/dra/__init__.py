"""The kubelet's DRA side in-process (plugin watcher, DRA manager calls) and a test allocator."""
