"""Observability: Prometheus metrics and the /healthz, /readyz, /status HTTP endpoints."""
