"""What several adapters need and none owns: the kit at the bottom of the I/O layers.

`tasks` (named, owned tasks), `lifecycle` (the `Service` that closes on a failed start),
`unix_grpc` (gRPC served on a unix socket: the path limit, the stale-socket probe, the check
that a fresh socket answers) and `fswatch` (one inotify directory watch). It imports nothing
of the plugin's but its error tree; the pure core never imports it. Nothing is re-exported
here, so that importing one piece does not load the libraries of the others.
"""
