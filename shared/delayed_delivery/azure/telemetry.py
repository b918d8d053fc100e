"""Logs and metrics to Application Insights through OpenTelemetry.

``configure_telemetry(env)`` turns on ``azure-monitor-opentelemetry`` only when
``APPLICATIONINSIGHTS_CONNECTION_STRING`` is set (once per process), exporting the
``delayed_delivery`` loggers with their fixed structured fields as custom dimensions. With
``APPLICATIONINSIGHTS_AUTHENTICATION_STRING`` containing ``Authorization=AAD`` it authenticates
with the managed identity, so no instrumentation key is needed for ingestion.

``DispatchMetrics`` records each run's counts and lateness on the global (or a given) meter provider:
``delayed_delivery.dispatched``, ``.failed_attempts``, ``.moved_to_error_queue``, ``.already_removed``,
``.lease_lost`` (counters) and ``delayed_delivery.lateness`` (histogram, seconds: transport lateness), each with
``shard``; with release control, ``delayed_delivery.release_lag`` (histogram, seconds: what the cap added) with
``shard`` and ``destination``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry import metrics

from ..dispatcher import DispatchReport

__all__ = ["ENV_APPINSIGHTS", "DispatchMetrics", "configure_telemetry"]

ENV_APPINSIGHTS = "APPLICATIONINSIGHTS_CONNECTION_STRING"
ENV_APPINSIGHTS_AUTH = "APPLICATIONINSIGHTS_AUTHENTICATION_STRING"
LOGGER_NAME = "delayed_delivery"

_configured = False
_lock = threading.Lock()


def _default_configure(**kwargs: Any) -> None:
    from azure.monitor.opentelemetry import configure_azure_monitor

    configure_azure_monitor(**kwargs)


def configure_telemetry(env: Mapping[str, str], configure: Callable[..., None] = _default_configure) -> bool:
    """Export logs and metrics to Application Insights when its connection string is set; True if enabled."""
    global _configured
    connection = env.get(ENV_APPINSIGHTS, "").strip()
    if not connection:
        return False
    with _lock:
        if _configured:
            return True
        kwargs: dict[str, Any] = {"connection_string": connection, "logger_name": LOGGER_NAME}
        if "authorization=aad" in env.get(ENV_APPINSIGHTS_AUTH, "").lower():
            from azure.identity import ManagedIdentityCredential

            client_id = env.get("AZURE_CLIENT_ID", "").strip() or None
            kwargs["credential"] = ManagedIdentityCredential(client_id=client_id)
        configure(**kwargs)
        _configured = True
        return True


class DispatchMetrics:
    """OpenTelemetry instruments for the dispatcher."""

    def __init__(self, meter_provider: metrics.MeterProvider | None = None) -> None:
        meter = (meter_provider or metrics.get_meter_provider()).get_meter(LOGGER_NAME)
        self.dispatched = meter.create_counter("delayed_delivery.dispatched", unit="{message}")
        self.failed_attempts = meter.create_counter("delayed_delivery.failed_attempts", unit="{message}")
        self.moved_to_error_queue = meter.create_counter("delayed_delivery.moved_to_error_queue", unit="{message}")
        self.already_removed = meter.create_counter("delayed_delivery.already_removed", unit="{message}")
        self.lease_lost = meter.create_counter("delayed_delivery.lease_lost", unit="{lease}")
        self.lateness = meter.create_histogram("delayed_delivery.lateness", unit="s")
        self.release_lag = meter.create_histogram(
            "delayed_delivery.release_lag", unit="s", description="Seconds release control added to a message"
        )

    def record(self, report: DispatchReport, shard: int, *, lease_lost: int = 0) -> None:
        """Add one run's report for ``shard``."""
        attrs = {"shard": shard}
        self.dispatched.add(report.dispatched, attrs)
        self.failed_attempts.add(report.failed_attempts, attrs)
        self.moved_to_error_queue.add(report.moved_to_error_queue, attrs)
        self.already_removed.add(report.already_removed, attrs)
        self.lease_lost.add(lease_lost, attrs)
        for seconds in report.lateness_seconds:
            self.lateness.record(seconds, attrs)
        for destination, lags in report.release_lag_seconds.items():
            where: dict[str, str | int] = {"shard": shard, "destination": destination}
            for seconds in lags:
                self.release_lag.record(seconds, where)
