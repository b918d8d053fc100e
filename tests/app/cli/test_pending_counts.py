"""``pending`` counts messages, not envelopes: where SQS can only count SQS messages (a packed envelope counts once) it
says so and gives a lower bound; the tier's exact count and the SQS queues' approximate ones (the ingest backlog
included) stay under their own headings and are never added up."""

from __future__ import annotations

from typing import Any

import pytest

from delayed_delivery.aws.queues import ensure_endpoint
from delayed_delivery.aws.sender import DelayedSend, SqsDelayedSender
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.aws.tier.config import BucketTierConfig
from delayed_delivery.aws.tier.provision import ensure_bucket_tier
from tests.app.cli.conftest import ok_json, run
from tests.aws.tier.conftest import s3 as s3  # the S3 client fixture on moto

pytestmark = pytest.mark.moto

SENT = 120


def _depth(sqs: Any, name: str) -> int:
    url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
    wanted = [
        "ApproximateNumberOfMessages",
        "ApproximateNumberOfMessagesDelayed",
        "ApproximateNumberOfMessagesNotVisible",
    ]
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=wanted)["Attributes"]
    return sum(int(attributes[k]) for k in wanted)


@pytest.fixture
def aws(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    for name in ("DELAYED_DELIVERY_LONG_DELAY_ROUTE", "DELAYED_DELIVERY_BUCKET_NAME", "DELAYED_DELIVERY_BUCKET_PREFIX"):
        monkeypatch.delenv(name, raising=False)
    return ["--cloud", "aws", "--endpoint-url", moto_endpoint, "--region", "us-east-1"]


def test_packed_envelopes_are_not_counted_as_messages(sqs: Any, aws: list[str]) -> None:
    ensure_endpoint(sqs, "orders")
    batch = [DelayedSend("orders", f"order {i}", "40d", message_id=f"o-{i}") for i in range(SENT)]
    SqsDelayedSender(sqs).send_delayed_batch(batch).raise_for_failures()
    envelopes = _depth(sqs, "orders-delay.fifo")
    assert 1 <= envelopes < SENT, "the sender packs long delays to one destination into envelopes"

    data = ok_json("pending", *aws)
    assert data["pending"] is None, "SQS has no exact count of messages"
    counts = data["approximate"]
    assert counts["sqs_messages"] == counts["messages_at_least"] == envelopes
    assert counts["envelope_max_messages"] >= SENT // envelopes
    assert "envelope counts once" in counts["note"] and "not a count of them" in counts["note"]

    text = run("pending", *aws)
    assert text.exit_code == 0, text.output
    out = " ".join(text.stdout.split())
    assert "approximate: SQS queue attributes, in SQS messages (an envelope counts once)" in out
    assert f"{envelopes} SQS message(s), so at least {envelopes} message(s)" in out
    assert "exact" not in out.split("limits:")[0]


def test_the_ingest_backlog_is_counted_apart_from_the_tiers_exact_count(sqs: Any, s3: Any, aws: list[str]) -> None:
    settings = SqsSettings(long_delay_route="buckets")
    ensure_endpoint(sqs, "orders")
    ensure_bucket_tier(s3, sqs, BucketTierConfig("pending-tier", sqs_settings=settings))
    batch = [DelayedSend("orders", f"order {i}", "2y", message_id=f"t-{i}") for i in range(30)]
    SqsDelayedSender(sqs, sqs_settings=settings).send_delayed_batch(batch).raise_for_failures()
    waiting = _depth(sqs, settings.bucket_ingest_queue)
    assert 1 <= waiting < 30

    tier = [*aws, "--bucket-name", "pending-tier"]
    before = ok_json("pending", *tier)
    assert before["pending"] == 0 and before["buckets"]["messages"] == 0, "nothing is in S3 yet: exact"
    assert before["approximate"]["ingest_sqs_messages"] == waiting
    assert before["approximate"]["ingest_queue"] == settings.bucket_ingest_queue
    text = " ".join(run("pending", *tier).stdout.split())
    assert "exact: time-bucket tier s3://pending-tier/delayed-delivery/buckets: 0 message(s)" in text
    assert f"ingest queue {settings.bucket_ingest_queue}: {waiting} SQS message(s) on their way" in text

    done = run("aws", "tier", "--endpoint-url", aws[3], "--region", "us-east-1", "--bucket-name", "pending-tier",
               "--every", "1", "--for", "2")  # fmt: skip
    assert done.exit_code == 0, done.output
    after = ok_json("pending", *tier)
    assert after["pending"] == after["buckets"]["messages"] == 30, "in S3 now, counted exactly"
    assert after["approximate"]["ingest_sqs_messages"] == 0
    assert after["approximate"]["sqs_messages"] == 0, "the exact and approximate counts are never added up"
