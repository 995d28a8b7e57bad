"""Observability: Prometheus metrics and the /healthz, /readyz, /status HTTP endpoints."""

from sharing_plugin.observability.http_server import MetricsServer, parse_metrics_address
from sharing_plugin.observability.metrics import Metrics
from sharing_plugin.observability.status import StatusBoard

__all__ = ["Metrics", "MetricsServer", "StatusBoard", "parse_metrics_address"]
