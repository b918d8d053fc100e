"""Migration into SQS (moto server) through the AWS adapter's sender; abort says plainly it cannot undo."""

from __future__ import annotations

import base64
import csv
import datetime as dt
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from delayed_delivery.delivery import DELIVERY_HEADER
from delayed_delivery.pipelines.migrate import MigrationOptions, abort_migration, run_migration
from tests.fixtures.moto import queue_depth

pytestmark = [pytest.mark.spark, pytest.mark.moto]


def _counts(sqs: Any, name: str) -> int:
    return queue_depth(sqs, sqs.get_queue_url(QueueName=name)["QueueUrl"])


def test_migrate_into_sqs_routes_by_delay_refuses_what_sqs_cannot_take_and_cannot_abort(
    spark: Any, sqs: Any, moto_endpoint: str, tmp_path: Path
) -> None:
    from delayed_delivery.aws.queues import ensure_endpoint

    ensure_endpoint(sqs, "orders")
    real_now = dt.datetime.now(dt.UTC)  # the sender computes delays from the real clock

    def row(i: int, due: dt.datetime, dest: str = "orders", body: bytes | None = None) -> dict[str, object]:
        return {"Id": f"s-{i}", "Destination": dest, "SagaId": "",
                "State": base64.b64encode(body if body is not None else f"b{i}".encode()).decode(),
                "Time": due.isoformat(), "Headers": json.dumps({"h": str(i)}), "Endpoint": "Sales"}  # fmt: skip

    rows = [
        row(1, real_now - timedelta(minutes=1)),  # already due: native, no delay
        row(2, real_now + timedelta(minutes=5)),  # native DelaySeconds
        row(3, real_now + timedelta(days=3)),  # via orders-delay.fifo
        row(4, real_now + timedelta(days=40)),  # via orders-delay.fifo
        row(5, real_now + timedelta(days=1), body=b"\xff\xfe"),  # not UTF-8: refused
        row(6, real_now + timedelta(days=1), dest="nosuchqueue"),  # no such queue: refused
    ]
    src = tmp_path / "src" / "x.csv"
    src.parent.mkdir()
    with src.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    out = str(tmp_path / "out")
    target = f"sqs:us-east-1?endpoint_url={moto_endpoint}"
    summary = run_migration(spark, MigrationOptions(source=str(src), target=target, batches=2), out, now=real_now)

    assert (summary.rows_written, summary.refused, summary.state) == (4, 2, "completed")
    assert _counts(sqs, "orders") == 2 and _counts(sqs, "orders-delay.fifo") == 2
    url = sqs.get_queue_url(QueueName="orders")["QueueUrl"]
    (got,) = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["All"], WaitTimeSeconds=1)["Messages"]
    # No control attribute: the user's header and the delivery header for the consumer (#16).
    assert got["Body"] == "b1" and set(got["MessageAttributes"]) == {"h", DELIVERY_HEADER}
    refused = {}
    for p in (Path(out) / "runs" / summary.run_id / "refused").glob("*.jsonl"):
        for line in p.read_text().splitlines():
            item = json.loads(line)
            refused[item["message_id"]] = item["reason"]
    assert set(refused) == {"s-5", "s-6"}
    assert "not UTF-8" in refused["s-5"] and "nosuchqueue" in refused["s-6"]

    result = abort_migration(spark, out, summary.run_id)
    assert not result.undone and "SQS cannot take back a sent message" in result.note
    assert _counts(sqs, "orders") == 2  # nothing changed
