"""``delayed-delivery aws requeue``: the in-package handler behind the local event source, on moto server."""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING

import pytest
from typer.testing import CliRunner

from delayed_delivery.app.cli.aws import aws_app
from delayed_delivery.aws.queues import EndpointQueues
from delayed_delivery.aws.sender import SqsDelayedSender
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.settings import DelayedDeliverySettings
from tests.aws.conftest import collect, handler_env

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

pytestmark = pytest.mark.moto
runner = CliRunner()


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, settings: DelayedDeliverySettings, sqs_settings: SqsSettings) -> None:
    """What the CDK stack would set, compressed (2 s hops); a fresh service name binds the logger anew."""
    for key, value in {
        **handler_env(settings, sqs_settings),
        "POWERTOOLS_SERVICE_NAME": f"cli-{uuid.uuid4().hex[:8]}",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL_SQS", raising=False)


def test_requeue_forwards_a_long_delay_and_exits_0(
    sqs: SQSClient, moto_endpoint: str, endpoint: EndpointQueues, sender: SqsDelayedSender, env: None
) -> None:
    receipt = sender.send_delayed("orders", "later", 4, message_id="cli-1")
    assert receipt.fifo_cycles >= 1  # longer than the 2 s cap: it waits on orders-delay.fifo
    result = runner.invoke(
        aws_app, ["requeue", "--queue", "orders", "--endpoint-url", moto_endpoint, "--for", "8", "--json"]
    )
    assert result.exit_code == 0, result.output
    counts = json.loads(result.output[result.output.index("{") :])
    assert counts["outcomes"].get("forwarded") == 1 and counts["handler_errors"] == 0, counts
    got = collect(sqs, endpoint.input_url, expect=1, timeout=10)  # forwarded with the rest of its delay (≤ 2 s)
    assert [m.body for m in got] == ["later"]
    assert "forwarded to the destination" not in result.output  # the handler's own logs stay out of it


def test_requeue_prints_one_line_errors_for_bad_input_and_an_unreachable_endpoint(
    moto_endpoint: str, endpoint: EndpointQueues, env: None
) -> None:
    cases = {
        ("--queue", "orders", "--endpoint-url", moto_endpoint, "--for", "0"): "positive number of seconds",
        ("--queue", "orders", "--for", "5"): "--local",
        ("--queue", "nope", "--endpoint-url", moto_endpoint, "--for", "5"): "does not exist",
        ("--queue", "orders", "--endpoint-url", "http://127.0.0.1:9", "--for", "5"): "Could not connect",
    }
    for args, expected in cases.items():
        result = runner.invoke(aws_app, ["requeue", *args])
        assert result.exit_code == 2, (args, result.output)
        assert expected in result.output and len(result.output.strip().splitlines()) == 1, (args, result.output)


def test_requeue_refuses_a_malformed_setting(moto_endpoint: str, env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DELAYED_DELIVERY_PACK_BYTES", "lots")
    result = runner.invoke(aws_app, ["requeue", "--queue", "orders", "--endpoint-url", moto_endpoint])
    assert result.exit_code == 2 and "DELAYED_DELIVERY_PACK_BYTES='lots'" in result.output
