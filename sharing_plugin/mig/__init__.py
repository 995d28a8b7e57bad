"""MIG partitioning: the pure placement solver."""
