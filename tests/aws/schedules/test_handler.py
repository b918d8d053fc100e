"""The schedule timer Lambda: built from the environment on its first call, EMF metrics and a summary line."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest

import functions.aws.schedule_timer as schedule_timer
from delayed_delivery.aws.schedules.config import ScheduleTimerConfig
from delayed_delivery.aws.schedules.handler import METRICS, build_schedule_timer_handler
from delayed_delivery.aws.schedules.store import DynamoDbScheduleStore
from delayed_delivery.clock import ManualClock
from delayed_delivery.errors import ConfigurationError
from delayed_delivery.schedules.catchup import CatchUp
from delayed_delivery.schedules.model import MessageTemplate, Schedule, ScheduleDefinition
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.testing.aws import LocalLambdaContext

from .conftest import TABLE

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_sqs import SQSClient

SCHEDULED = {"version": "0", "detail-type": "Scheduled Event", "source": "aws.events", "detail": {}}
NINE = datetime(2030, 1, 7, 8, 0, tzinfo=UTC)


def test_the_entry_point_reads_nothing_at_import() -> None:
    schedule_timer.reset()
    assert schedule_timer.handler.built is False


def test_a_run_sends_and_emits_the_schedule_metrics(
    schedule_db: DynamoDBClient, sqs: SQSClient, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("reports", "errors"):
        sqs.create_queue(QueueName=name)
    clock = ManualClock(NINE - timedelta(minutes=30))
    store = DynamoDbScheduleStore(schedule_db, TABLE, clock=clock)
    store.setup_infrastructure()
    definition = ScheduleDefinition("0 9 * * *", start=clock.now(), zone="Europe/Berlin")
    store.create(Schedule.new("h-1", definition, MessageTemplate("reports", b"hi")))
    config = ScheduleTimerConfig(
        settings=DelayedDeliverySettings(error_queue="errors"),
        table=TABLE,
        service=f"schedules-{uuid.uuid4().hex[:8]}",
        metrics_namespace="T",
    )
    handler = build_schedule_timer_handler(config, dynamodb=schedule_db, sqs=sqs, clock=clock)
    clock.set(NINE - timedelta(seconds=100))
    capsys.readouterr()
    reply = handler(SCHEDULED, LocalLambdaContext(function_name="schedule-timer", timeout_s=60.0))
    assert reply["ok"] is True and reply["fired"] == 1 and reply["missed"] == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    emf = [x for x in lines if "_aws" in x]
    names = {m["Name"] for x in emf for d in x["_aws"]["CloudWatchMetrics"] for m in d["Metrics"]}
    assert {metric for metric, _ in METRICS.values()} <= names
    assert any(x.get("ScheduleOccurrencesFired") in (1, 1.0, [1.0]) for x in emf), emf
    assert any(x.get("message") == "schedule timer run" for x in lines), lines


@pytest.mark.usefixtures("in_a_lambda")
def test_missed_occurrences_are_one_json_line_with_their_ids(
    schedule_db: DynamoDBClient, sqs: SQSClient, capsys: pytest.CaptureFixture[str]
) -> None:
    """The timer's own lines (a standard-library logger) go out as Powertools JSON, keys and all: in a Lambda the
    runtime's text format would keep only the message, not the ids the docs and the alarm point to."""
    for name in ("reports", "errors"):
        sqs.create_queue(QueueName=name)
    clock = ManualClock(NINE - timedelta(days=3) + timedelta(minutes=1))
    store = DynamoDbScheduleStore(schedule_db, TABLE, clock=clock)
    store.setup_infrastructure()
    definition = ScheduleDefinition("0 9 * * *", start=clock.now(), zone="Europe/Berlin", catch_up=CatchUp("skip"))
    store.create(Schedule.new("down-3d", definition, MessageTemplate("reports", b"hi")))
    config = ScheduleTimerConfig(settings=DelayedDeliverySettings(error_queue="errors"), table=TABLE,
                                 service=f"schedules-{uuid.uuid4().hex[:8]}", metrics_namespace="T")  # fmt: skip
    handler = build_schedule_timer_handler(config, dynamodb=schedule_db, sqs=sqs, clock=clock)
    clock.set(NINE + timedelta(minutes=1))  # down for three days: 09:00 of the last three days were missed
    capsys.readouterr()
    reply = handler(SCHEDULED, LocalLambdaContext(function_name="schedule-timer", timeout_s=60.0))
    assert reply["ok"] is True and reply["missed"] == 3
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    missed = [x for x in lines if x.get("event") == "schedule_missed"]
    assert len(missed) == 1, lines
    assert missed[0]["schedule_id"] == "down-3d" and missed[0]["count"] == 3
    assert missed[0]["occurrence_ids"] == [f"down-3d@2030-01-0{d}T08:00:00Z" for d in (5, 6, 7)]
    assert missed[0]["function_name"] == "schedule-timer"  # the invocation's keys, as on the handler's own lines


def test_release_rates_without_a_table_is_one_clear_error() -> None:
    env: dict[str, Any] = {"DELAYED_DELIVERY_RELEASE_RATES": '{"reports": 5}'}
    with pytest.raises(ConfigurationError, match="DELAYED_DELIVERY_RELEASE_TABLE"):
        build_schedule_timer_handler(env, dynamodb=object(), sqs=object())  # type: ignore[arg-type]


def test_a_bad_lead_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="DELAYED_DELIVERY_SCHEDULE_LEAD_SECONDS"):
        ScheduleTimerConfig.from_env({"DELAYED_DELIVERY_SCHEDULE_LEAD_SECONDS": "900"})
