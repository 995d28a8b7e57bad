"""MIG placement solver (pure): desired profile counts + current instances -> a MigPlan."""
