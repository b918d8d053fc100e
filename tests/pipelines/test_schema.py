"""Schema mapping and row normalisation (pure Python, no Spark)."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime

import pytest

from delayed_delivery.errors import ConfigurationError
from delayed_delivery.pipelines.ledger import RunManifest
from delayed_delivery.pipelines.schema import (
    MIGRATED_FROM_HEADER,
    SAGA_ID_HEADER,
    BodyEncoding,
    ColumnMapping,
    LegacyShape,
    NormalizedRow,
    Reject,
    detect_shape,
    normalize_row,
    parse_due_time,
    to_epoch_us,
)
from delayed_delivery.pipelines.targets import TargetSpec

TM_COLUMNS = ["Id", "Destination", "SagaId", "State", "Time", "Headers", "OwningTimeoutManager"]


def tm_row(**overrides: object) -> dict[str, object]:
    row: dict[str, object] = {
        "Id": "t-1",
        "Destination": "orders",
        "SagaId": "saga-9",
        "State": base64.b64encode(b"hello").decode(),
        "Time": "2026-03-01 12:00:00.250",
        "Headers": json.dumps({"NServiceBus.MessageId": "abc", "n": 3}),
        "OwningTimeoutManager": "Sales",
    }
    row.update(overrides)
    return row


def test_timeout_manager_row_maps_every_documented_column() -> None:
    mapping = ColumnMapping.for_columns(LegacyShape.TIMEOUT_MANAGER, TM_COLUMNS)
    out = normalize_row(tm_row(), mapping)
    assert isinstance(out, NormalizedRow)
    assert (out.message_id, out.destination, out.body, out.endpoint) == ("t-1", "orders", b"hello", "Sales")
    assert out.due_us == to_epoch_us(datetime(2026, 3, 1, 12, 0, 0, 250_000, tzinfo=UTC))
    headers = json.loads(out.headers_json)
    assert headers == {
        "NServiceBus.MessageId": "abc",
        "n": "3",
        SAGA_ID_HEADER: "saga-9",
        MIGRATED_FROM_HEADER: "timeout-manager",
    }


def test_delayed_store_row_takes_retry_count_and_the_default_endpoint() -> None:
    cols = ["id", "destination", "body", "due", "headers", "RetryCount"]
    mapping = ColumnMapping.for_columns(LegacyShape.DELAYED_STORE, cols, BodyEncoding.HEX, "Billing")
    row = {"id": "d-1", "destination": "invoices", "body": "0x6869", "due": "2026-01-01T00:00:00+02:00",
           "headers": "", "RetryCount": "2"}  # fmt: skip
    out = normalize_row(row, mapping)
    assert isinstance(out, NormalizedRow)
    assert (out.body, out.failure_count, out.endpoint) == (b"hi", 2, "Billing")
    assert out.due_us == to_epoch_us(datetime(2025, 12, 31, 22, tzinfo=UTC))


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"Destination": " "}, "missing destination"),
        ({"Destination": None}, "missing destination"),
        ({"Id": ""}, "missing id"),
        ({"Id": "x" * 200}, "id longer than 128 characters"),
        ({"Time": "yesterday"}, "unparsable time 'yesterday'"),
        ({"Time": None}, "missing time"),
        ({"Headers": "{nope"}, "unparsable headers (not a JSON object)"),
        ({"Headers": "[1, 2]"}, "unparsable headers (not a JSON object)"),
        ({"State": "***"}, "unparsable body (not base64)"),
    ],
)
def test_malformed_rows_become_rejects_with_a_reason(overrides: dict[str, object], reason: str) -> None:
    mapping = ColumnMapping.for_columns(LegacyShape.TIMEOUT_MANAGER, TM_COLUMNS)
    assert normalize_row(tm_row(**overrides), mapping) == Reject(reason)


def test_shape_detection_and_missing_columns_are_clear() -> None:
    assert detect_shape(TM_COLUMNS) is LegacyShape.TIMEOUT_MANAGER
    assert detect_shape(["Id", "Destination", "State", "Time", "Headers", "RetryCount"]) is LegacyShape.DELAYED_STORE
    with pytest.raises(ConfigurationError, match="--shape"):
        detect_shape(["Id", "Destination"])
    with pytest.raises(ConfigurationError, match="no column for destination"):
        ColumnMapping.for_columns(LegacyShape.DELAYED_STORE, ["Id", "State", "Time"])


def test_naive_times_are_utc_and_offsets_are_converted() -> None:
    assert parse_due_time("2026-01-01T10:00:00Z") == datetime(2026, 1, 1, 10, tzinfo=UTC)
    assert parse_due_time("2026-01-01 10:00:00") == datetime(2026, 1, 1, 10, tzinfo=UTC)
    assert parse_due_time("2026-01-01T10:00:00-01:00") == datetime(2026, 1, 1, 11, tzinfo=UTC)


def test_target_urls_parse_and_unknown_schemes_are_refused() -> None:
    spec = TargetSpec.parse("sqlite:/tmp/x.db?table=migrated")
    assert (spec.scheme, spec.location, spec.option("table")) == ("sqlite", "/tmp/x.db", "migrated")
    with pytest.raises(ConfigurationError, match="unknown target"):
        TargetSpec.parse("ftp://x")


def test_manifest_refuses_changed_arguments(tmp_path: object) -> None:
    RunManifest.open(str(tmp_path), "r1", {"cutoff": "", "source": "a"})
    RunManifest.open(str(tmp_path), "r1", {"cutoff": "", "source": "a"})
    with pytest.raises(ConfigurationError, match=r"different arguments \(cutoff: was '', now '2026'\)"):
        RunManifest.open(str(tmp_path), "r1", {"cutoff": "2026", "source": "a"})
