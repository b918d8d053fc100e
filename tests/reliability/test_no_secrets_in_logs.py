"""No message bodies, attribute values or credentials in logs at the default level (moto server)."""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest

from delayed_delivery import DelayedDeliverySettings, DelayedMessage, Dispatcher, ManualClock, SqliteDelayedMessageStore
from delayed_delivery.aws.queues import ensure_endpoint
from delayed_delivery.aws.requeue.handler import build_handler
from delayed_delivery.aws.transport import SqsTransport
from delayed_delivery.testing.aws import LocalLambdaContext
from tests.reliability.sqslab import LAB_SQS, handler_env, lab_settings
from tests.reliability.test_requeue_fuzz import _record, _string_attr

pytestmark = pytest.mark.moto

BODY = "BODY-SECRET-5c1e9a"
VALUE = "ATTR-SECRET-77d0b2"
KEY = "KEY-SECRET-a41f03"
SECRETS = (BODY, VALUE, KEY)


def _client(endpoint: str) -> Any:
    return boto3.client(
        "sqs",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="AKIDLOGTEST",
        aws_secret_access_key=KEY,
    )


def _everything_logged(caplog: pytest.LogCaptureFixture, captured: pytest.CaptureFixture[str]) -> str:
    out, err = captured.readouterr()
    records = "\n".join(f"{r.getMessage()} {r.__dict__!r}" for r in caplog.records)
    return "\n".join((out, err, records))


@pytest.fixture(autouse=True)
def _default_log_level(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default level, whatever an earlier test or the shell set."""
    monkeypatch.delenv("POWERTOOLS_LOG_LEVEL", raising=False)
    monkeypatch.delenv("LOG_LEVEL", raising=False)


def test_requeue_handler_logs_no_body_attribute_or_key(
    moto_endpoint: str, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.INFO)
    sqs = _client(moto_endpoint)
    ep = ensure_endpoint(
        sqs, f"lg{uuid.uuid4().hex[:8]}", lab_settings("logs"), sqs_settings=LAB_SQS, visibility_timeout=1
    )
    handler = build_handler(handler_env(lab_settings("logs")), sqs_client=sqs)
    attrs = {"secret": _string_attr(VALUE, "String")}
    records = [
        _record(ep.delay_arn, BODY, _string_attr("1"), attrs, {}),  # forwarded
        _record(ep.delay_arn, BODY, _string_attr("9"), attrs, {}),  # requeued
        _record(ep.delay_arn, BODY, None, attrs, {}),  # poison: error queue
        _record(ep.delay_arn, BODY, _string_attr(VALUE), attrs, {}),  # poison: garbage control value
    ]
    response = handler({"Records": records}, LocalLambdaContext())
    assert response["batchItemFailures"] == []
    logged = _everything_logged(caplog, capsys)
    for event in ("forwarded to the destination", "requeued to the delay queue", "moved to the error queue"):
        assert event in logged  # the logs were captured, so their absence below means something
    for secret in (BODY, KEY):
        assert secret not in logged
    # The garbage control value is quoted in the error-queue reason (it is the product's control data, not
    # the user's); the user's own attribute values never are.
    assert logged.count(VALUE) == logged.count(f"DelaySeconds='{VALUE}'"), "a user attribute value was logged"


def test_core_dispatcher_with_sqs_transport_logs_no_body_or_key(
    moto_endpoint: str, tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.INFO)
    sqs = _client(moto_endpoint)
    settings = DelayedDeliverySettings(error_queue="logs-errors", number_of_retries=0)
    ensure_endpoint(sqs, "logs", settings)
    store = SqliteDelayedMessageStore(tmp_path / "store.db")
    store.setup_infrastructure()
    now = datetime(2030, 1, 1, tzinfo=UTC)
    store.store_many(
        [
            DelayedMessage("ok-1", "logs", BODY.encode(), now - timedelta(seconds=1), {"secret": VALUE}),
            DelayedMessage("gone-1", "no-such-queue", BODY.encode(), now - timedelta(seconds=1), {"secret": VALUE}),
            DelayedMessage("bin-1", "logs", b"\xff\xfe" + BODY.encode(), now - timedelta(seconds=1), {"secret": VALUE}),
        ]
    )
    clock = ManualClock(now)
    Dispatcher(store, SqsTransport(sqs, clock=clock), settings, clock=clock).dispatch_due()
    assert len(store) == 0  # the non-UTF-8 body went to the error queue as base64
    # An error queue that does not exist: the message stays in the store (logged, retried).
    store.store(DelayedMessage("gone-2", "no-such-queue", BODY.encode(), now, {"secret": VALUE}))
    missing = settings.with_(error_queue="no-such-errors")
    Dispatcher(store, SqsTransport(sqs, clock=clock), missing, clock=clock).dispatch_due()
    assert len(store) == 1
    logged = _everything_logged(caplog, capsys)
    assert "dispatched" in logged and "moved to the error queue" in logged and "it stays in the store" in logged
    for secret in SECRETS:
        assert secret not in logged
    store.close()
