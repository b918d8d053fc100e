"""The SQS route against moto server: send (native and FIFO hops), pending from attributes (cancel and reschedule:
``test_aws_cancel.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from delayed_delivery.aws.queues import ensure_endpoint
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.headers import DELAY_SECONDS_ATTRIBUTE
from tests.app.cli.conftest import ok_json, one_line_error, run

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

pytestmark = pytest.mark.moto


@pytest.fixture
def aws(sqs: SQSClient, moto_endpoint: str) -> list[str]:
    ensure_endpoint(sqs, "orders", sqs_settings=SqsSettings(fifo_queue_delay=1))
    return ["--cloud", "aws", "--endpoint-url", moto_endpoint, "--region", "us-east-1"]


def test_send_takes_the_native_route_or_the_fifo_hops(sqs: SQSClient, aws: list[str]) -> None:
    short = ok_json("send", *aws, "--to", "orders", "--delay", "5m", "--body", "soon", "--id", "short-1")
    assert short == {**short, "message_id": "short-1", "route": "sqs-native", "queue": "orders", "fifo_cycles": 0}
    long = ok_json("send", *aws, "--to", "orders", "--delay", "40d", "--body", "later", "-H", "type=Reminder")
    assert long["route"] == "sqs-fifo" and long["queue"] == "orders-delay.fifo" and long["fifo_cycles"] > 3000
    url = sqs.get_queue_url(QueueName="orders-delay.fifo")["QueueUrl"]
    got = sqs.receive_message(  # the test's FIFO queue delays 1 s, not 900 s
        QueueUrl=url, WaitTimeSeconds=5, MessageAttributeNames=["All"], MessageSystemAttributeNames=["All"]
    )
    (message,) = got["Messages"]
    assert message["Body"] == "later" and message["MessageAttributes"]["type"]["StringValue"] == "Reminder"
    assert int(message["MessageAttributes"][DELAY_SECONDS_ATTRIBUTE]["StringValue"]) >= 40 * 86_400 - 5
    assert message["Attributes"]["MessageGroupId"] == long["message_id"]
    text = run("send", *aws, "--to", "orders", "--delay", "2h", "--body", "x")
    assert text.exit_code == 0 and "route: sqs-fifo" in text.stdout


def test_pending_reads_queue_attributes_and_states_its_limits(aws: list[str]) -> None:
    ok_json("send", *aws, "--to", "orders", "--delay", "40d", "--body", "a")
    ok_json("send", *aws, "--to", "orders", "--delay", "60s", "--body", "b")
    data = ok_json("pending", *aws)
    (row,) = data["queues"]
    assert row["queue"] == "orders" and row["hop_cycle"] == 1 and row["final_native_delay"] == 1
    assert data["pending"] is None and data["approximate"]["sqs_messages"] == 2 and "approximate" in data["limits"]
    assert data["error_queue"] == "error" and data["error_queue_messages"] == 0
    assert ok_json("pending", *aws, "--queue", "orders")["approximate"]["messages_at_least"] == 2
    text = run("pending", *aws)
    assert text.exit_code == 0 and "limits:" in text.stdout


def test_unknown_queue(aws: list[str]) -> None:
    one_line_error(run("send", *aws, "--to", "nope", "--delay", "1h", "--body", "a"), "'nope'", "does not exist")
    one_line_error(run("pending", *aws, "--queue", "nope"), "does not exist")


def test_binary_body_is_refused(aws: list[str], tmp_path: object) -> None:
    from pathlib import Path

    blob = Path(str(tmp_path)) / "b.bin"
    blob.write_bytes(b"\xff\xfe\x00")
    one_line_error(run("send", *aws, "--to", "orders", "--delay", "1h", "--body", f"@{blob}"), "UTF-8")


def test_local_points_at_moto_on_5000_with_test_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    from delayed_delivery.app.routes import CloudOptions, SqsOperatorRoute

    monkeypatch.delenv("AWS_ENDPOINT_URL_SQS", raising=False)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    route = SqsOperatorRoute(CloudOptions("aws", local=True))
    assert route.client.meta.endpoint_url == "http://127.0.0.1:5000"
    assert route.client.meta.region_name == "us-east-1"
    credentials = getattr(route.client, "_request_signer")._credentials  # noqa: B009
    assert credentials.access_key == "testing"
