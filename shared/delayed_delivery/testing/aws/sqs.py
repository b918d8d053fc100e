"""SQS helpers for tests and benchmarks: drain a queue with a deadline, build the events Lambda hands a handler."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["drain", "fifo_record", "sqs_event"]

#: The ARN a hand-built record names when the test does not care which queue it came from.
SOME_DELAY_QUEUE_ARN = "arn:aws:sqs:us-east-1:123456789012:orders-delay.fifo"


def drain(
    sqs: Any,
    url: str,
    *,
    expect: int = 0,
    timeout: float = 20.0,
    linger: float = 0.0,
    system_attributes: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """Receive and delete every message at ``url``; poll until ``expect`` came or ``timeout`` passed, then until
    ``linger`` seconds pass with nothing new.

    A deadline, never a sleep for the delay: a delayed message may show up later than its delay (LocalStack moves
    delayed messages once a second; SQS promises no sub-second timing either).
    """
    got: list[dict[str, Any]] = []
    give_up = time.monotonic() + timeout
    quiet_until = time.monotonic() + linger
    while True:
        request: dict[str, Any] = {"QueueUrl": url, "MaxNumberOfMessages": 10, "WaitTimeSeconds": 0}
        request["MessageAttributeNames"] = ["All"]
        if system_attributes:
            request["MessageSystemAttributeNames"] = list(system_attributes)
        batch: list[dict[str, Any]] = list(sqs.receive_message(**request).get("Messages", []))
        now = time.monotonic()
        if batch:
            got += batch
            entries = [{"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(batch)]
            sqs.delete_message_batch(QueueUrl=url, Entries=entries)
            quiet_until = now + linger
            continue
        waiting = len(got) < expect and now < give_up
        if not waiting and now >= quiet_until:
            return got
        time.sleep(0.1)


def fifo_record(
    body: str,
    *,
    arn: str = SOME_DELAY_QUEUE_ARN,
    message_id: str | None = None,
    group: str | None = None,
    sent_ms: int | None = None,
    receive_count: int = 1,
    attributes: Mapping[str, tuple[str, str]] | None = None,
) -> dict[str, Any]:
    """A record of a FIFO queue as Lambda's SQS event source hands it over; ``attributes``: name -> (type, value)."""
    mid = message_id or str(uuid.uuid4())
    group = group or mid
    sent = str(int(time.time() * 1000) if sent_ms is None else sent_ms)
    return {
        "messageId": mid,
        "receiptHandle": f"rh-{mid}",
        "body": body,
        "attributes": {
            "ApproximateReceiveCount": str(receive_count),
            "SentTimestamp": sent,
            "ApproximateFirstReceiveTimestamp": sent,
            "MessageGroupId": group,
            "MessageDeduplicationId": f"{group}:0",
        },
        "messageAttributes": {
            name: {"dataType": kind, "stringValue": value, "stringListValues": [], "binaryListValues": []}
            for name, (kind, value) in (attributes or {}).items()
        },
        "md5OfBody": "",
        "eventSource": "aws:sqs",
        "eventSourceARN": arn,
        "awsRegion": arn.split(":")[3] if arn.count(":") >= 5 else "us-east-1",
    }


def sqs_event(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The event a Lambda function gets from its SQS event source mapping."""
    return {"Records": [dict(r) for r in records]}
