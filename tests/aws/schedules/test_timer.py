"""The schedule timer on moto server: sends with DelaySeconds, exactly once per occurrence, crashes replayed."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest

from delayed_delivery.aws.receive import delivered_from_boto3
from delayed_delivery.aws.release_calendar import ReleaseCalendar, ensure_release_table
from delayed_delivery.aws.schedules.layout import SHARDS, page_item, shard_of
from delayed_delivery.aws.schedules.sends import OccurrenceSender
from delayed_delivery.aws.schedules.store import DynamoDbScheduleStore
from delayed_delivery.aws.schedules.timer import QUARANTINE_MINUTE, ScheduleTimer
from delayed_delivery.clock import ManualClock
from delayed_delivery.delivery import DELIVERY_HEADER, decode_delivery
from delayed_delivery.errors import MessageInFlightError
from delayed_delivery.release import ReleaseRates
from delayed_delivery.schedules.catchup import CatchUp, CatchUpPolicy
from delayed_delivery.schedules.model import MessageTemplate, Schedule, ScheduleDefinition, ScheduleState
from delayed_delivery.schedules.operations import pause, resume

from .conftest import TABLE

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_sqs import SQSClient

T0 = datetime(2030, 1, 7, 6, 0, tzinfo=UTC)  # a Monday; Berlin and Paris are at +01:00
NINE_BERLIN = datetime(2030, 1, 7, 8, 0, tzinfo=UTC)


class Sent:
    """What the timer's SQS client sent: (occurrence id, DelaySeconds, queue) per entry, in order."""

    def __init__(self, sqs: SQSClient) -> None:
        self.entries: list[tuple[str, int, str]] = []
        sqs.meta.events.register("before-parameter-build.sqs.SendMessageBatch", self._keep)

    def _keep(self, params: dict[str, Any], **_: Any) -> None:
        queue = str(params["QueueUrl"]).rsplit("/", 1)[-1]
        for e in params["Entries"]:
            header = e["MessageAttributes"].get(DELIVERY_HEADER, {}).get("StringValue")
            oid = decode_delivery(header).message_id or e["MessageAttributes"]["DelayedDelivery.Occurrence"]
            self.entries.append((str(oid), int(e.get("DelaySeconds", 0)), queue))

    @property
    def ids(self) -> list[str]:
        return [i for i, _, q in self.entries if q != "errors"]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def queues(sqs: SQSClient) -> SQSClient:
    for name in ("reports", "errors"):
        sqs.create_queue(QueueName=name)
    return sqs


@pytest.fixture
def store(schedule_db: DynamoDBClient, clock: ManualClock) -> DynamoDbScheduleStore:
    s = DynamoDbScheduleStore(schedule_db, TABLE, clock=clock, lease_seconds=60, wait_seconds=5)
    s.setup_infrastructure()
    return s


def timer(store: DynamoDbScheduleStore, sqs: SQSClient, clock: ManualClock, **kwargs: Any) -> ScheduleTimer:
    release = kwargs.pop("release", None)
    sender = OccurrenceSender(sqs, "errors", clock, release=release, send_threads=1)
    threads = kwargs.pop("shard_threads", 4)
    return ScheduleTimer(store, sender, clock, lead_seconds=kwargs.pop("lead", 300), shard_threads=threads, **kwargs)


def daily(sid: str, zone: str = "Europe/Berlin", **definition: Any) -> Schedule:
    """A schedule to ``reports`` (every day at 09:00 local unless told), starting 10 minutes before 09:00 Berlin."""
    start = NINE_BERLIN - timedelta(minutes=10)
    spec: dict[str, Any] = {"expression": "0 9 * * *", "start": start, "zone": zone, **definition}
    template = MessageTemplate("reports", b'{"report": "daily"}', {"kind": "report"})
    return Schedule.new(sid, ScheduleDefinition(**spec), template)


def due_pages(db: DynamoDBClient) -> list[dict[str, Any]]:
    out = []
    for shard in range(SHARDS):
        reply = db.query(TableName=TABLE, KeyConditionExpression="pk = :p",
                         ExpressionAttributeValues={":p": {"S": f"due#{shard:02d}"}})  # fmt: skip
        out += reply["Items"]
    return out


def test_each_occurrence_is_sent_once_with_its_id_and_delay(
    store: DynamoDbScheduleStore, queues: SQSClient, clock: ManualClock, schedule_db: DynamoDBClient
) -> None:
    for i in range(12):
        store.create(daily(f"d-{i}", "Europe/Berlin" if i % 2 else "Europe/Paris"))
    sent = Sent(queues)
    t = timer(store, queues, clock)
    clock.set(NINE_BERLIN - timedelta(seconds=270))  # 08:55:30 local: 09:00 is inside the 300 s lead
    result = t.run()
    assert result.fired == 12 and result.failures == 0 and result.missed == 0
    assert sorted(sent.ids) == sorted(f"d-{i}@2030-01-07T08:00:00Z" for i in range(12))
    assert {d for _, d, _ in sent.entries} == {270}
    for minute in range(1, 30, 7):  # until 09:25: nothing more
        clock.set(NINE_BERLIN - timedelta(seconds=270) + timedelta(minutes=minute))
        assert t.run().fired == 0
    assert len(sent.ids) == 12
    s = store.get("d-3")
    assert s is not None and s.cursor == NINE_BERLIN and s.fired == 1 and s.next_at == NINE_BERLIN + timedelta(days=1)
    # packed: one page per shard holding all of its schedules for tomorrow 09:00
    pages = due_pages(schedule_db)
    shards = {shard_of(f"d-{i}") for i in range(12)}
    assert len(pages) == len(shards)
    assert sum(int(p["n"]["N"]) for p in pages) == 12


def test_an_occurrence_arrives_with_its_body_headers_and_delivery_header(
    store: DynamoDbScheduleStore, queues: SQSClient, clock: ManualClock
) -> None:
    store.create(daily("arrive"))
    clock.set(NINE_BERLIN - timedelta(seconds=1))
    assert timer(store, queues, clock).run().fired == 1
    url = queues.get_queue_url(QueueName="reports")["QueueUrl"]
    got = queues.receive_message(QueueUrl=url, WaitTimeSeconds=10, MessageAttributeNames=["All"],
                                 AttributeNames=["All"])["Messages"]  # fmt: skip
    delivered = delivered_from_boto3(got[0], destination="reports")
    assert delivered.message_id == "arrive@2030-01-07T08:00:00Z"
    assert delivered.body == b'{"report": "daily"}'
    assert delivered.due_at == NINE_BERLIN
    attrs = {k: v["StringValue"] for k, v in got[0]["MessageAttributes"].items()}
    assert attrs["kind"] == "report" and attrs["DelayedDelivery.ScheduleId"] == "arrive"
    assert attrs["DelayedDelivery.Occurrence"] == "2030-01-07T08:00:00Z"


def _failing_once(obj: Any, name: str, when: Callable[[], bool] = lambda: True) -> list[int]:
    """Make ``obj.name`` raise once (a crash at that step); returns a list counting the crashes."""
    real = getattr(obj, name)
    crashes: list[int] = []

    def step(*args: Any, **kwargs: Any) -> Any:
        if not crashes and when():
            crashes.append(1)
            raise RuntimeError(f"killed at {name}")
        return real(*args, **kwargs)

    setattr(obj, name, step)
    return crashes


@pytest.mark.parametrize("step", ["put_pages", "written", "delete_page"])
def test_a_crash_in_a_batch_is_replayed_as_planned(
    store: DynamoDbScheduleStore, queues: SQSClient, clock: ManualClock, step: str
) -> None:
    for i in range(6):
        store.create(daily(f"c-{i}", expression="*/5 * * * *", start=NINE_BERLIN - timedelta(minutes=1)))
    sent = Sent(queues)
    t = timer(store, queues, clock, lead=120)
    target = store.leases if step == "written" else store
    crashes = _failing_once(target, step)
    clock.set(NINE_BERLIN - timedelta(seconds=100))
    first = t.run()
    assert crashes == [1] and first.failures == 1
    clock.set(NINE_BERLIN + timedelta(seconds=200))  # the next run replays the crashed batch with its own now
    again = t.run()
    assert again.passes_replayed == 1 and again.failures == 0
    ids = sent.ids
    expected = {f"c-{i}@2030-01-07T08:00:00Z" for i in range(6)}
    assert expected <= set(ids)
    repeated = [i for i in set(ids) if ids.count(i) > 1]
    if step == "delete_page":  # the batch was journaled written: the replay only deletes its pages
        assert repeated == []
    else:  # crashed after its sends, before the batch was written: its occurrences go again, same ids
        assert repeated and set(repeated) <= expected
    for minute in range(0, 15, 3):
        clock.set(NINE_BERLIN + timedelta(seconds=200, minutes=minute))
        t.run()
    later = [i for i in sent.ids if not i.endswith("T08:00:00Z")]
    assert len(later) == len(set(later)), "after the replay every occurrence goes once"
    for i in range(6):
        s = store.get(f"c-{i}")
        assert s is not None and s.fired == len([x for x in set(sent.ids) if x.startswith(f"c-{i}@")])


def test_a_shard_held_by_another_timer_is_skipped_until_its_lease_expires(
    store: DynamoDbScheduleStore, queues: SQSClient, clock: ManualClock
) -> None:
    store.create(daily("held"))
    shard = shard_of("held")
    clock.set(NINE_BERLIN - timedelta(seconds=200))
    other = store.leases.acquire(shard, "other-timer")
    assert other is not None
    sent = Sent(queues)
    t = timer(store, queues, clock)
    assert t.run(shards=range(shard, shard + 1)).shards_skipped_leased == 1 and sent.ids == []
    clock.advance(61)  # the other timer's lease (60 s) expired
    assert t.run(shards=range(shard, shard + 1)).fired == 1
    assert sent.ids == ["held@2030-01-07T08:00:00Z"]


class _Sqs:
    """The AWS route's canceller: SQS cannot withdraw a delayed message."""

    def remove(self, message_id: str) -> bool:
        raise MessageInFlightError(f"{message_id} is on its queue with its delay: SQS cannot withdraw it")


def test_pause_stops_the_timer_and_resume_goes_on_from_now(
    store: DynamoDbScheduleStore, queues: SQSClient, clock: ManualClock
) -> None:
    store.create(daily("p", expression="*/10 * * * *", start=NINE_BERLIN - timedelta(minutes=1)))
    sent = Sent(queues)
    t = timer(store, queues, clock, lead=300)
    clock.set(NINE_BERLIN - timedelta(seconds=30))
    t.run()  # 08:00 and 08:10? horizon = end of 08:04: just 08:00
    assert sent.ids == ["p@2030-01-07T08:00:00Z"]
    clock.set(NINE_BERLIN + timedelta(seconds=90))
    t.run()  # horizon end of 08:06: nothing new
    paused = pause(store, _Sqs(), "p", clock.now())
    assert paused.schedule.state is ScheduleState.PAUSED and paused.in_flight == ()
    for minute in range(0, 40, 4):
        clock.set(NINE_BERLIN + timedelta(seconds=90, minutes=minute))
        t.run()
    assert sent.ids == ["p@2030-01-07T08:00:00Z"]
    resumed = resume(store, "p", NINE_BERLIN + timedelta(minutes=41, seconds=30))
    assert resumed.skipped_paused == 4  # 08:10 .. 08:40
    clock.set(NINE_BERLIN + timedelta(minutes=46))
    result = t.run()
    assert result.skipped_paused == 4
    assert sent.ids == ["p@2030-01-07T08:00:00Z", "p@2030-01-07T08:50:00Z"]


def test_paused_with_an_occurrence_already_sent_reports_it_in_flight(
    store: DynamoDbScheduleStore, queues: SQSClient, clock: ManualClock
) -> None:
    store.create(daily("q", expression="*/10 * * * *", start=NINE_BERLIN - timedelta(minutes=1)))
    t = timer(store, queues, clock, lead=600)
    clock.set(NINE_BERLIN + timedelta(seconds=30))
    t.run()  # 08:10 is sent (fires at 08:10, inside the lead)
    result = pause(store, _Sqs(), "q", clock.now())
    assert result.in_flight == ("q@2030-01-07T08:10:00Z",)
    s = store.get("q")
    assert s is not None and s.cursor == NINE_BERLIN + timedelta(minutes=10)


def test_an_undeliverable_occurrence_goes_to_the_error_queue_and_a_throttled_one_again(
    store: DynamoDbScheduleStore, queues: SQSClient, clock: ManualClock
) -> None:
    gone = Schedule.new("gone", ScheduleDefinition("0 9 * * *", start=T0, zone="Europe/Berlin"),
                        MessageTemplate("no-such-queue", b"x"))  # fmt: skip
    store.create(gone)
    store.create(daily("throttled"))
    sent = Sent(queues)
    throttle: list[int] = []

    def refuse(params: dict[str, Any], **_: Any) -> None:
        if str(params["QueueUrl"]).endswith("/reports") and not throttle:
            throttle.append(1)
            raise _throttling()

    queues.meta.events.register("before-parameter-build.sqs.SendMessageBatch", refuse)
    t = timer(store, queues, clock)
    clock.set(NINE_BERLIN - timedelta(seconds=200))
    first = t.run()
    assert first.to_error_queue == 1 and first.retried == 1
    errors = queues.receive_message(QueueUrl=queues.get_queue_url(QueueName="errors")["QueueUrl"],
                                    MessageAttributeNames=["All"], WaitTimeSeconds=2)["Messages"]  # fmt: skip
    reason = errors[0]["MessageAttributes"]["DelayedDelivery.FailureReason"]["StringValue"]
    assert "destination gone" in reason
    assert errors[0]["MessageAttributes"]["DelayedDelivery.ScheduleId"]["StringValue"] == "gone"
    s = store.get("throttled")
    assert s is not None and s.fired == 0 and s.next_at == NINE_BERLIN  # its row was written back before 09:00
    clock.advance(60)
    assert t.run().fired == 1
    assert sent.ids.count("throttled@2030-01-07T08:00:00Z") == 2  # the throttled try, then the one that went
    clock.advance(60)
    assert t.run().fired == 0
    done = store.get("gone")
    assert done is not None and done.cursor == NINE_BERLIN  # decided: on the error queue with its reason


def _throttling() -> Exception:
    from botocore.exceptions import ClientError

    return ClientError({"Error": {"Code": "ThrottlingException", "Message": "slow down"},
                        "ResponseMetadata": {"HTTPStatusCode": 400}}, "SendMessageBatch")  # fmt: skip


def test_a_capped_destination_takes_its_seconds_from_the_release_calendar(
    store: DynamoDbScheduleStore, queues: SQSClient, clock: ManualClock, schedule_db: DynamoDBClient
) -> None:
    ensure_release_table(schedule_db, "release-test")
    for i in range(9):
        store.create(daily(f"r-{i}"))
    sent = Sent(queues)
    calendar = ReleaseCalendar(schedule_db, "release-test", ReleaseRates.of({"reports": 2}))
    # one shard at a time: moto does not apply concurrent ADDs to one item atomically (DynamoDB does)
    t = timer(store, queues, clock, release=calendar, shard_threads=1)
    clock.set(NINE_BERLIN - timedelta(seconds=100))
    result = t.run()
    assert result.fired == 9
    delays = sorted(d for _, d, _ in sent.entries)
    assert delays[0] >= 100 and max(delays.count(d) for d in delays) <= 2  # 2 a second at most, none early
    assert delays[-1] >= 104


def test_an_unreadable_entry_is_set_aside_and_the_others_fire(
    store: DynamoDbScheduleStore, queues: SQSClient, clock: ManualClock, schedule_db: DynamoDBClient
) -> None:
    store.create(daily("fine"))
    shard = shard_of("fine")
    item = page_item(shard, "001894003200#hostile", 0, {})
    item["e"] = {"S": json.dumps({"evil": ["not", "an", "entry"]})}
    schedule_db.put_item(TableName=TABLE, Item=item)
    clock.set(NINE_BERLIN - timedelta(seconds=100))
    result = timer(store, queues, clock).run()
    assert result.fired == 1 and result.unreadable == 1
    kept = [p for p in due_pages(schedule_db) if p["sk"]["S"].startswith(QUARANTINE_MINUTE)]
    assert len(kept) == 1 and "evil" in kept[0]["e"]["S"]


def test_jittered_occurrences_fire_inside_their_jitter_and_once(
    store: DynamoDbScheduleStore, queues: SQSClient, clock: ManualClock
) -> None:
    for i in range(5):
        store.create(daily(f"j-{i}", expression="0 * * * *", jitter_seconds=1800))
    sent = Sent(queues)
    t = timer(store, queues, clock, lead=300)
    start = NINE_BERLIN - timedelta(minutes=6)
    for minute in range(0, 100, 4):  # until 09:34: past 09:00 plus its jitter (up to 30 min)
        clock.set(start + timedelta(minutes=minute, seconds=1))
        t.run()
    ids = sent.ids
    assert len(ids) == len(set(ids)) == 10  # 08:00 and 09:00 of each, once
    assert {i.split("@")[1] for i in ids} == {"2030-01-07T08:00:00Z", "2030-01-07T09:00:00Z"}
    for _, delay, _q in sent.entries:
        assert 0 <= delay <= 900


def test_catch_up_after_a_day_down_applies_the_policy(
    store: DynamoDbScheduleStore, queues: SQSClient, clock: ManualClock
) -> None:
    rule = CatchUp(CatchUpPolicy.ALL, 6 * 3600, 1000)
    store.create(daily("late", expression="0 * * * *", start=T0, catch_up=rule))
    sent = Sent(queues)
    clock.set(T0 + timedelta(hours=24, minutes=30))  # down from T0: 25 hourly occurrences 06:00 .. 06:00 next day
    result = timer(store, queues, clock).run()
    assert result.fired_late == 6 and result.missed == 19  # the window keeps 01:00 .. 06:00 (R - 6 h = 00:30)
    assert len(sent.ids) == 6 and all(d == 0 for _, d, _ in sent.entries)
    s = store.get("late")
    assert s is not None and s.missed == 19 and s.fired == 6
