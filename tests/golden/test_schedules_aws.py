"""The AWS schedules table's wire formats: a schedule's row, a due page (entries), a shard's lease with a pass and a
batch in progress, and an occurrence as the timer sends it to SQS. Today's writers write the newest golden file of
each; every version is read back. The fixed inputs are part of the goldens: never edit them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from delayed_delivery.aws.schedules.layout import (
    Entry,
    entry_of,
    merged,
    page_item,
    page_of_item,
    row_item,
    row_of_item,
    shard_of,
)
from delayed_delivery.aws.schedules.sends import OccurrenceSender, Outgoing
from delayed_delivery.clock import ManualClock
from delayed_delivery.delivery import DELIVERY_HEADER, decode_delivery
from delayed_delivery.schedules.catchup import CatchUp, CatchUpPolicy
from delayed_delivery.schedules.model import MessageTemplate, Schedule, ScheduleDefinition, ScheduleState
from delayed_delivery.schedules.occurrences import expand
from tests.golden import wire
from tests.golden.test_writers import _check

SCHEDULE_ID = "golden-aws-1"
DEFINITION = ScheduleDefinition(
    expression="*/20 9 * * MON-FRI",
    start=datetime(2031, 3, 1, tzinfo=UTC),
    zone="Europe/Berlin",
    dst="auto",
    end=datetime(2032, 1, 1, tzinfo=UTC),
    jitter_seconds=45,
    catch_up=CatchUp(CatchUpPolicy.ALL, 7200, 50),
)
TEMPLATE = MessageTemplate("reports", '{"report": "daily ☕"}'.encode(), {"kind": "report", "note": "café"})
CURSOR = datetime(2031, 3, 10, 8, 20, tzinfo=UTC)
NEXT_AT = datetime(2031, 3, 10, 8, 40, tzinfo=UTC)
PAUSED_CURSOR = datetime(2031, 3, 10, 8, 31, 5, 123456, tzinfo=UTC)


def _schedule() -> Schedule:
    s = Schedule.new(SCHEDULE_ID, DEFINITION, TEMPLATE)
    return s.next_version(cursor=CURSOR, next_at=NEXT_AT, fired=12, missed=3, last_fired=CURSOR)


def _paused() -> Schedule:
    return _schedule().next_version(state=ScheduleState.PAUSED, paused_at=PAUSED_CURSOR, skipped_paused=4,
                                    cursor=PAUSED_CURSOR)  # fmt: skip


def _entries() -> dict[str, Entry]:
    return {
        SCHEDULE_ID: entry_of(_schedule(), 3),
        "other-1": Entry(1, 5, PAUSED_CURSOR, NEXT_AT, 2, 0, None, 4),
        "other-2": Entry(2, 2, None, NEXT_AT, 0, 0, None),
    }


def _page() -> dict[str, Any]:
    return page_item(shard_of(SCHEDULE_ID), "001930898400#m.0123456789abcdef", 0, _entries())


def _lease() -> dict[str, Any]:
    return {
        "pk": {"S": "lease#05"},
        "sk": {"S": "lease"},
        "owner": {"S": "timer-0f1e"},
        "until": {"N": "1930898700000"},
        "pass_now": {"N": "1930898100000000"},
        "pass_done": {"BOOL": False},
        "pass_pages": {"L": [{"S": "001930898400#m.0123456789abcdef"}, {"S": "001930898400#o.golden-aws-1.3"}]},
        "pass_written": {"BOOL": False},
    }


def _sqs_occurrence() -> dict[str, Any]:
    """The SendMessageBatch entry of the occurrence after the cursor, sent 4 minutes before it fires."""
    occurrence = next(expand(DEFINITION.recurrence(), NEXT_AT, schedule_id=SCHEDULE_ID,
                             max_jitter=DEFINITION.jitter_seconds))  # fmt: skip
    clock = ManualClock(occurrence.fire_at - timedelta(minutes=4))
    sender = OccurrenceSender(None, "errors", clock)  # type: ignore[arg-type]
    entry = sender._entry("0", Outgoing(occurrence, _schedule()), clock.now(), 262_144)
    assert not isinstance(entry, str)
    return dict(entry)


def test_the_row_is_the_golden_one() -> None:
    _check("dynamodb_schedule_row", {"active": row_item(_schedule(), 3), "paused": row_item(_paused(), 4)})


def test_a_due_page_is_the_golden_one() -> None:
    _check("dynamodb_due_page", _page())


def test_a_lease_is_the_golden_one() -> None:
    _check("dynamodb_schedule_lease", _lease())


def test_an_occurrence_sent_to_sqs_is_the_golden_one() -> None:
    _check("sqs_occurrence", _sqs_occurrence())


@pytest.mark.parametrize("golden", wire.versions("dynamodb_schedule_row"))
def test_rows_read_back(golden: str) -> None:
    document = wire.load(golden)
    assert row_of_item(document["active"]).schedule == _schedule()
    paused = row_of_item(document["paused"])
    assert paused.schedule == _paused() and paused.rev == 4


@pytest.mark.parametrize("golden", wire.versions("dynamodb_due_page"))
def test_pages_read_back_and_merge_with_their_rows(golden: str) -> None:
    page = page_of_item(shard_of(SCHEDULE_ID), wire.load(golden))
    assert dict(page.entries) == _entries() and not page.unreadable
    assert page.minute == datetime(2031, 3, 10, 8, 40, tzinfo=UTC)
    row = row_of_item(wire.load(wire.versions("dynamodb_schedule_row")[-1])["active"])
    assert merged(row, page.entries[SCHEDULE_ID]) == _schedule()


@pytest.mark.parametrize("golden", wire.versions("dynamodb_schedule_lease"))
def test_leases_read_back_as_an_unfinished_pass(golden: str) -> None:
    from delayed_delivery.aws.schedules.lease import ShardLeases

    class Client:
        def update_item(self, **_: Any) -> dict[str, Any]:
            return {"Attributes": wire.load(golden)}

    held = ShardLeases(Client(), "t", ManualClock(datetime(2031, 3, 10, 8, 50, tzinfo=UTC))).acquire(5, "me")  # type: ignore[arg-type]
    assert held is not None and held.unfinished == datetime(2031, 3, 10, 8, 35, tzinfo=UTC)
    assert held.batch == ("001930898400#m.0123456789abcdef", "001930898400#o.golden-aws-1.3")
    assert held.batch_written is False


@pytest.mark.parametrize("golden", wire.versions("sqs_occurrence"))
def test_an_occurrence_reads_back_at_the_consumer(golden: str) -> None:
    entry = wire.load(golden)
    info = decode_delivery(entry["MessageAttributes"][DELIVERY_HEADER]["StringValue"])
    assert (
        info.message_id
        == entry["MessageAttributes"]["DelayedDelivery.ScheduleId"]["StringValue"]
        + "@"
        + (entry["MessageAttributes"]["DelayedDelivery.Occurrence"]["StringValue"])
    )
    assert info.route == "native" and info.due_ms is not None and info.sent_ms is not None
    assert entry["DelaySeconds"] == (info.due_ms - info.sent_ms) // 1000 == 240
    assert entry["MessageAttributes"]["kind"]["StringValue"] == "report"


def test_the_aws_schedule_goldens_exist() -> None:
    for kind in ("dynamodb_schedule_row", "dynamodb_due_page", "dynamodb_schedule_lease", "sqs_occurrence"):
        assert wire.versions(kind), f"no golden file for {kind}: its reader test would not run"
