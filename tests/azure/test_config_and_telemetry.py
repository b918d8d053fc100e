"""Naming defaults and overrides, app-settings parsing, error translation and telemetry set-up."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    ResourceNotFoundError,
    ServiceRequestError,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from delayed_delivery.azure import telemetry
from delayed_delivery.azure.blob_lease import BlobLease
from delayed_delivery.azure.config import AzureDelayedDeliveryConfig
from delayed_delivery.azure.sdk_errors import translate
from delayed_delivery.azure.storage_queue import decode_envelope, encode_envelope
from delayed_delivery.azure.table_store import TableDelayedMessageStore
from delayed_delivery.dispatcher import DispatchReport
from delayed_delivery.errors import ConfigurationError, InvalidMessageError, PermanentError, TransientError
from delayed_delivery.model import DelayedMessage

CONN = "UseDevelopmentStorage=true"


def test_default_names_are_delays_plus_sha1_of_the_endpoint() -> None:
    config = AzureDelayedDeliveryConfig.for_endpoint("Sales.Orders", connection_string=CONN)
    expected = "delays" + hashlib.sha1(b"Sales.Orders").hexdigest()
    assert config.table_name == config.container_name == expected


def test_names_can_be_overridden_and_are_validated() -> None:
    config = AzureDelayedDeliveryConfig.for_endpoint(
        "orders", table_name="OrdersDelays", container_name="orders-delays", connection_string=CONN
    )
    assert (config.table_name, config.container_name) == ("OrdersDelays", "orders-delays")
    for bad in (
        {"table_name": "1abc"},
        {"table_name": "ab"},
        {"container_name": "Has_Upper"},
        {"container_name": "a--b"},
    ):
        with pytest.raises(ConfigurationError, match="invalid Azure"):
            AzureDelayedDeliveryConfig.for_endpoint("orders", connection_string=CONN, **bad)


def test_from_env_reads_app_settings() -> None:
    env = {
        "DELAYED_DELIVERY_ENDPOINT": "orders",
        "DELAYED_DELIVERY_STORAGE_ACCOUNT": "acct",
        "AZURE_CLIENT_ID": "00000000-0000-0000-0000-000000000001",
        "DELAYED_DELIVERY_SHARDS": "4",
        "DELAYED_DELIVERY_LEASE_SECONDS": "20",
        "DELAYED_DELIVERY_RUN_SECONDS": "40",
        "DELAYED_DELIVERY_NUMBER_OF_RETRIES": "3",
    }
    config = AzureDelayedDeliveryConfig.from_env(env)
    assert config.connection_string is None and config.account_name == "acct"
    assert (config.shards, config.lease_seconds, config.run_seconds) == (4, 20, 40.0)
    assert config.settings.number_of_retries == 3 and config.settings.max_concurrency == 16
    host_only = AzureDelayedDeliveryConfig.from_env(
        {"DELAYED_DELIVERY_ENDPOINT": "o", "AzureWebJobsStorage__accountName": "h"}
    )
    assert host_only.account_name == "h"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "DELAYED_DELIVERY_ENDPOINT"),
        ({"DELAYED_DELIVERY_ENDPOINT": "o"}, "no storage account"),
        ({"DELAYED_DELIVERY_ENDPOINT": "o", "AzureWebJobsStorage": CONN, "DELAYED_DELIVERY_SHARDS": "two"}, "SHARDS"),
        (
            {"DELAYED_DELIVERY_ENDPOINT": "o", "AzureWebJobsStorage": CONN, "DELAYED_DELIVERY_LEASE_SECONDS": "10"},
            "15 to 60",
        ),
        ({"DELAYED_DELIVERY_ENDPOINT": "o", "AzureWebJobsStorage": CONN, "DELAYED_DELIVERY_RUN_SECONDS": "-1"}, "RUN"),
        (
            {"DELAYED_DELIVERY_ENDPOINT": "o", "AzureWebJobsStorage": CONN, "DELAYED_DELIVERY_ENABLED": "maybe"},
            "ENABLED",
        ),
    ],
)
def test_bad_app_settings_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        AzureDelayedDeliveryConfig.from_env(env)


def test_store_and_lease_refuse_bad_parameters() -> None:
    from azure.data.tables import TableClient
    from azure.storage.blob import ContainerClient

    table = TableClient.from_connection_string(CONN, "delays")
    for kwargs in ({"shards": 0}, {"shards": 1001}, {"claim_timeout": 0}, {"shards": 2, "fetch_shards": [2]}):
        with pytest.raises(ConfigurationError):
            TableDelayedMessageStore(table, **kwargs)  # type: ignore[arg-type]
    container = ContainerClient.from_connection_string(CONN, "delays")
    for duration in (14, 61, -1):
        with pytest.raises(ConfigurationError, match="15 to 60"):
            BlobLease(container, duration=duration)


def _http(status: int) -> HttpResponseError:
    exc = HttpResponseError(message=f"status {status}")
    exc.status_code = status
    return exc


def test_sdk_errors_become_core_errors() -> None:
    assert isinstance(translate(_http(503), "x"), TransientError)
    assert isinstance(translate(_http(429), "x"), TransientError)
    assert isinstance(translate(_http(400), "x"), PermanentError)
    assert isinstance(translate(_http(404), "x"), ConfigurationError)
    assert isinstance(translate(ServiceRequestError("down"), "x"), TransientError)
    assert isinstance(translate(ResourceNotFoundError("gone"), "x"), ConfigurationError)
    assert isinstance(translate(ClientAuthenticationError("no"), "x"), ConfigurationError)
    assert "sending" in str(translate(_http(500), "sending"))


def test_envelope_round_trips_and_refuses_oversized_messages() -> None:
    from datetime import UTC, datetime

    m = DelayedMessage("id-ü", "orders", b"\x00\xff", datetime(2030, 1, 1, tzinfo=UTC), {"ключ": "⏰"})
    text = encode_envelope(m)
    assert text.isascii()
    got = decode_envelope(text)
    assert (got.message_id, got.body, dict(got.headers)) == ("id-ü", b"\x00\xff", {"ключ": "⏰"})
    with pytest.raises(InvalidMessageError, match="at most 65536"):
        encode_envelope(DelayedMessage("big", "orders", b"x" * 50_000, m.due_at))
    with pytest.raises(InvalidMessageError):
        decode_envelope("not json")


def test_telemetry_is_enabled_only_with_a_connection_string(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(telemetry, "_configured", False)
    calls: list[dict[str, Any]] = []
    assert telemetry.configure_telemetry({}, configure=lambda **kw: calls.append(kw)) is False
    assert calls == []
    env = {"APPLICATIONINSIGHTS_CONNECTION_STRING": "InstrumentationKey=00000000-0000-0000-0000-000000000000"}
    assert telemetry.configure_telemetry(env, configure=lambda **kw: calls.append(kw)) is True
    assert telemetry.configure_telemetry(env, configure=lambda **kw: calls.append(kw)) is True
    assert len(calls) == 1, "configured once per process"
    assert calls[0]["logger_name"] == "delayed_delivery"
    assert calls[0]["connection_string"] == env["APPLICATIONINSIGHTS_CONNECTION_STRING"]


def test_dispatch_metrics_are_recorded_per_shard() -> None:
    reader = InMemoryMetricReader()
    metrics = telemetry.DispatchMetrics(MeterProvider(metric_readers=[reader]))
    report = DispatchReport(dispatched=3, failed_attempts=1, moved_to_error_queue=1, lateness_seconds=[0.2, 0.4, 1.5])
    metrics.record(report, shard=2, lease_lost=1)
    data = reader.get_metrics_data()
    assert data is not None
    points: dict[str, Any] = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                points[metric.name] = list(metric.data.data_points)
    assert points["delayed_delivery.dispatched"][0].value == 3
    assert points["delayed_delivery.dispatched"][0].attributes == {"shard": 2}
    assert points["delayed_delivery.lease_lost"][0].value == 1
    assert points["delayed_delivery.lateness"][0].count == 3
    assert points["delayed_delivery.lateness"][0].max == 1.5
