"""The consumers' ``consumed`` log line (``observe_lateness`` on either cloud): a wire format the report reads.

Lines logged today may be read by ``delayed-delivery report`` long after (exported logs), so the line is pinned like a
message: today's receive helpers write the newest golden file; the report reads every version. The fixed inputs below
are part of the goldens: never edit them (add new ones beside them for a new version).
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from delayed_delivery import headers as hdr
from delayed_delivery.clock import ManualClock
from delayed_delivery.delivery import DELIVERY_HEADER, encode_delivery, epoch_ms
from delayed_delivery.logjson import JsonFormatter
from tests.golden import wire
from tests.golden.test_writers import _check

#: An occurrence of a schedule, sent by the AWS timer 4 minutes ahead, received 1.25 s after it fired.
AWS_OCCURRENCE = ("golden-aws-1", datetime(2031, 3, 10, 8, 40, tzinfo=UTC), 42)
#: An occurrence written into the Azure table and dispatched from it (no send time known), received 0.5 s late.
AZURE_OCCURRENCE = ("golden-azure-1", datetime(2031, 3, 10, 7, 0, tzinfo=UTC), 0)
#: A one-off message that took the FIFO route (three days, two hops), received 2 s late.
ONE_OFF = ("golden-order-1", datetime(2031, 3, 13, 8, 0, tzinfo=UTC), 259_200)


def _sqs_message(message_id: str, attributes: dict[str, str], received: datetime) -> dict[str, Any]:
    """A ``receive_message`` message (all attributes) carrying ``attributes`` as string message attributes."""
    return {
        "MessageId": f"sqs-{message_id}",
        "Body": '{"report": "daily ☕"}',
        "Attributes": {"SentTimestamp": str(epoch_ms(received) - 1000),
                       "ApproximateFirstReceiveTimestamp": str(epoch_ms(received))},
        "MessageAttributes": {k: {"DataType": "String", "StringValue": v} for k, v in attributes.items()},
    }  # fmt: skip


def _occurrence_headers(schedule_id: str, nominal: datetime) -> dict[str, str]:
    return {hdr.SCHEDULE_ID: schedule_id, hdr.OCCURRENCE: nominal.strftime("%Y-%m-%dT%H:%M:%SZ"), "kind": "report"}


def _delivered() -> dict[str, Any]:
    """The three messages as each cloud's receive helper reads them."""
    from delayed_delivery.aws.receive import delivered_from_boto3
    from delayed_delivery.azure.receive import delivered_from_queue_message
    from delayed_delivery.azure.storage_queue import encode_envelope
    from delayed_delivery.model import DelayedMessage

    sid, nominal, jitter = AWS_OCCURRENCE
    occurrence_id, due = f"{sid}@{nominal:%Y-%m-%dT%H:%M:%SZ}", nominal + timedelta(seconds=jitter)
    delivery = encode_delivery(message_id=occurrence_id, due_ms=epoch_ms(due),
                               sent_ms=epoch_ms(due - timedelta(minutes=4)), route="native")  # fmt: skip
    attributes = {DELIVERY_HEADER: delivery, **_occurrence_headers(sid, nominal)}
    aws_occurrence = delivered_from_boto3(
        _sqs_message(occurrence_id, attributes, due + timedelta(seconds=1.25)), destination="reports"
    )
    sid, nominal, _ = AZURE_OCCURRENCE
    occurrence_id = f"{sid}@{nominal:%Y-%m-%dT%H:%M:%SZ}"
    delivery = encode_delivery(message_id=occurrence_id, due_ms=epoch_ms(nominal), route="table")
    headers = {**_occurrence_headers(sid, nominal), DELIVERY_HEADER: delivery}
    text = encode_envelope(DelayedMessage(occurrence_id, "reports", b"digest", nominal, headers))
    queue_message = SimpleNamespace(content=text, id="azure-queue-id", inserted_on=nominal)
    azure_occurrence = delivered_from_queue_message(
        queue_message, destination="reports", clock=ManualClock(nominal + timedelta(seconds=0.5))
    )
    message_id, due, delay = ONE_OFF
    delivery = encode_delivery(message_id=message_id, due_ms=epoch_ms(due),
                               sent_ms=epoch_ms(due - timedelta(seconds=delay)), hops=2, route="fifo")  # fmt: skip
    one_off = delivered_from_boto3(
        _sqs_message(message_id, {DELIVERY_HEADER: delivery}, due + timedelta(seconds=2)), destination="orders"
    )
    return {"aws_occurrence": aws_occurrence, "azure_occurrence": azure_occurrence, "aws_one_off": one_off}


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(JsonFormatter())
        self.lines: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(self.format(record)))


def _consumed_lines() -> dict[str, Any]:
    """Each message's ``consumed`` line as ``observe_lateness`` logs it (JSON lines), the log time left out."""
    from delayed_delivery.aws import receive as aws_receive
    from delayed_delivery.azure import receive as azure_receive

    lines: dict[str, Any] = {}
    logger = logging.getLogger("delayed_delivery.consumer")  # the helpers' own logger
    level, propagate = logger.level, logger.propagate
    for name, delivered in _delivered().items():
        handler = _Lines()
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
        try:
            if delivered.cloud == "aws":
                aws_receive.observe_lateness(delivered)
            else:
                azure_receive.observe_lateness(delivered, azure_receive.ConsumerMetrics())
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)
            logger.propagate = propagate
        (line,) = handler.lines
        line.pop("timestamp")
        lines[name] = line
    return lines


def test_the_consumed_lines_are_the_golden_ones() -> None:
    _check("consumed_line", _consumed_lines())


def test_the_consumed_line_golden_exists() -> None:
    assert wire.versions("consumed_line"), "no golden file for consumed_line: its reader test would not run"


def _expected_band(line: dict[str, Any]) -> str:
    """The band the report's docs (docs/pipelines.md) give a ``consumed`` line."""
    from delayed_delivery.pipelines.report import BANDS

    if line.get("occurrence"):
        return "recurring"
    delay = line.get("delay_s")
    if delay is None:
        return "unknown"
    return next(label for label, upper in BANDS if delay <= upper)


@pytest.mark.spark
def test_the_report_reads_every_version_of_the_consumed_line(spark: Any, tmp_path: Path) -> None:
    """All versions in one report (one Spark build): each message counted once, with its lateness and band."""
    from delayed_delivery.pipelines.report import build_report

    logs = tmp_path / "logs"
    logs.mkdir()
    expected: dict[str, tuple[str, str, float]] = {}
    with (logs / "consumed.jsonl").open("w", encoding="utf-8") as fh:
        for golden in wire.versions("consumed_line"):
            for line in wire.load(golden).values():
                line = {**line, "message_id": f"{line['message_id']}#{golden}"}
                received = datetime.fromisoformat(line["due_at"]) + timedelta(seconds=line["consumer_lateness_s"])
                fh.write(json.dumps({"timestamp": received.isoformat(), **line}, ensure_ascii=False) + "\n")
                expected[line["message_id"]] = (line["destination"], _expected_band(line), line["consumer_lateness_s"])
    report = build_report(spark, str(logs), str(tmp_path / "report"))
    by_endpoint = {r["endpoint"]: (r["messages"], r["max_s"]) for r in report.tables["consumer_lateness_by_endpoint"]}
    by_band = {r["band"]: (r["messages"], r["max_s"]) for r in report.tables["consumer_lateness_by_band"]}
    for key, table in ((0, by_endpoint), (1, by_band)):
        groups = {e[key] for e in expected.values()}
        assert table == {
            g: (sum(1 for e in expected.values() if e[key] == g), max(e[2] for e in expected.values() if e[key] == g))
            for g in groups
        }
