"""Property-based fuzzing of the cancellation table's records against the tier's timer and the requeue function (#23).

A careless or hostile writer can leave any item in the table: a naive or unparsable request time, a due time before
1970 or past 9000, an unknown kind, a missing or absurd expiry, attributes of the wrong type. Each example writes a
few such items to DynamoDB on moto, each naming one message, beside a message without a record, and runs the real
timer (moto S3 + SQS, simulated time) or the real requeue handler over them.

Invariant: nothing raises, no bucket fails and no batch item is retried; the neighbour goes out on time; each named
message meets exactly the fate an independent reading of its item gives (delivered, dropped by a cancel, moved by a
reschedule, or the error queue with a reason when the item cannot be used), and every record applied or held is
deleted while the others stay. ``RELIABILITY_FUZZ_EXAMPLES`` sets the number of examples (40; a quarter of that for
each of the two end-to-end tests, which run moto for every example).
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from botocore.exceptions import ClientError
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from delayed_delivery.aws.cancellations import DynamoDbCancellationStore, _record, ensure_cancellation_table
from delayed_delivery.aws.queues import ensure_endpoint
from delayed_delivery.aws.requeue.handler import build_handler
from delayed_delivery.aws.tier.store import S3BucketStore
from delayed_delivery.aws.tier.timer import BucketTimer
from delayed_delivery.cancellations import CancellationCache, StoredRecord, is_live
from delayed_delivery.clock import ManualClock
from delayed_delivery.delivery import epoch_ms
from delayed_delivery.headers import DELAY_SECONDS_ATTRIBUTE, FAILURE_REASON
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.testing.aws import LocalLambdaContext
from delayed_delivery.testing.aws.sqs import drain, fifo_record
from delayed_delivery.timebuckets.apply import Found, plan_bucket
from delayed_delivery.timebuckets.format import BucketMessage
from delayed_delivery.timebuckets.wheel import BucketLevel
from tests.fixtures.moto import REGION
from tests.reliability.sqslab import handler_env, lab_settings

EXAMPLES = int(os.environ.get("RELIABILITY_FUZZ_EXAMPLES", "40"))
END_TO_END = max(4, EXAMPLES // 4)
#: No shrinking for the end-to-end tests: each example runs moto.
PHASES = (Phase.explicit, Phase.reuse, Phase.generate)
START = datetime(2031, 1, 1, tzinfo=UTC)
#: The messages' first send: records requested before it (less the 1 s allowance) do not bind them.
SENT = START - timedelta(seconds=10)
#: The timer runs this long (simulated); a message moved to a due time inside it is delivered.
RUN_SECONDS = 10
_LATEST_MS = 220_898_664_000_000  # 9000-01-01T00:00:00Z
#: One table for every example of a test; each example names its own endpoint (its partition).
TABLE = "fuzz-records"


@pytest.fixture
def dynamodb(moto_endpoint: str) -> Any:
    """DynamoDB on moto with the records table (read timeouts long enough for a loaded machine)."""
    import boto3
    from botocore.config import Config

    client = boto3.client(
        "dynamodb",
        endpoint_url=moto_endpoint,
        region_name=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(connect_timeout=5, read_timeout=30),
    )
    ensure_cancellation_table(client, TABLE)
    return client


iso_in_range = st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(8999, 12, 30), timezones=st.just(UTC))
offsets = st.sampled_from([timezone(timedelta(hours=14)), timezone(timedelta(hours=-12)), UTC])
texts = st.one_of(
    iso_in_range.map(datetime.isoformat),
    st.datetimes(timezones=offsets).map(datetime.isoformat),  # any year 1-9999, out of range in UTC too
    st.datetimes().map(datetime.isoformat),  # naive
    st.sampled_from(
        [
            "",
            "Z",
            "2030-01-01T00:00:00Z",
            "1960-01-01T00:00:00Z",
            "9500-01-01T00:00:00+00:00",
            "9999-12-31T23:59:59-05:00",
            "0001-01-01T00:00:00+01:00",
            "1969-12-31T23:59:59.999+00:00",
            "8999-12-31T23:59:59.999900+00:00",
            (START - timedelta(seconds=30)).isoformat(),  # before the send: does not bind
            (START + timedelta(seconds=4)).isoformat(),  # a reschedule inside the run
            "yesterday",
            "2030-01-01T00:00:00+00:00" + "0" * 80,
        ]
    ),
    st.text(max_size=30),
)
values = st.one_of(
    texts.map(lambda t: {"S": t}),
    texts.map(lambda t: {"S": t}),
    st.integers(-(10**20), 10**20).map(lambda n: {"N": str(n)}),
    st.just({"BOOL": True}),
    st.just({"NULL": True}),
)
expiries = st.one_of(
    st.integers(epoch_ms(START) // 1000 + 3600, 10**11).map(lambda n: {"N": str(n)}),
    st.integers(0, epoch_ms(START) // 1000 - 1).map(lambda n: {"N": str(n)}),  # expired
    st.sampled_from([{"N": "-5"}, {"N": "1.5"}, {"N": "1E+3"}, {"N": "9" * 30}, {"S": "soon"}, {"NULL": True}]),
)
kinds = st.one_of(
    st.sampled_from(["cancel", "reschedule"]).map(lambda k: {"S": k}),
    st.sampled_from(["Cancel", "", "pause", "reschedule "]).map(lambda k: {"S": k}),
    st.just({"N": "1"}),
)
items = st.fixed_dictionaries(
    {}, optional={"kind": kinds, "requested_at": values, "expires_at": expiries, "due_at": values}
)


@dataclass(frozen=True)
class Fate:
    """What should become of a message named by an item: ``deliver``, ``drop``, ``move`` (to ``due``) or ``error``."""

    kind: str
    due: datetime | None = None
    #: Whether the record is used (and so deleted) when the message is met.
    applies: bool = False


def _time(value: Any) -> datetime | None:
    """The item attribute as a usable time (aware, 1970 to 9000 in UTC), else ``None``: written apart from the
    reader under test."""
    text = value.get("S") if isinstance(value, dict) else None
    if not isinstance(text, str) or len(text) > 64:
        return None
    try:
        when = datetime.fromisoformat(text)
        if when.tzinfo is None or when.utcoffset() is None:
            return None
        when = when.astimezone(UTC)
    except (ValueError, OverflowError):
        return None
    return when if datetime(1970, 1, 1, tzinfo=UTC) <= when < datetime(9000, 1, 1, tzinfo=UTC) else None


def _expiry(value: Any) -> datetime | None:
    text = value.get("N") if isinstance(value, dict) else None
    try:
        return datetime.fromtimestamp(int(text), tz=UTC) if isinstance(text, str) and len(text) <= 20 else None
    except (ValueError, OverflowError, OSError):
        return None


def fate(item: dict[str, Any], sent: datetime, now: datetime, *, timer: bool = True) -> Fate:
    """The fate of a message first sent at ``sent`` under a record stored as ``item``, read at ``now`` (by the timer,
    whose buckets end at 9000, or by the requeue function)."""
    kind = item.get("kind", {}).get("S")
    requested, expires = _time(item.get("requested_at")), _expiry(item.get("expires_at"))
    due = _time(item["due_at"]) if "due_at" in item else None
    readable = (
        kind in ("cancel", "reschedule")
        and requested is not None
        and expires is not None
        and ("due_at" not in item if kind == "cancel" else due is not None)
    )
    if expires is not None and expires <= now:
        return Fate("deliver")  # expired: ignored, whatever it holds
    if not readable:
        return Fate("error", applies=True)
    assert requested is not None
    if sent > requested + timedelta(seconds=1):
        return Fate("deliver")  # sent after it was requested: not bound
    if kind == "cancel":
        return Fate("drop", applies=True)
    assert due is not None
    if timer and round(due.timestamp() * 1000) >= _LATEST_MS:  # rounds onto 9000: no bucket holds it
        return Fate("error", applies=True)
    return Fate("move", due, applies=True)


@settings(max_examples=EXAMPLES * 5, deadline=None)
@given(records=st.lists(items, min_size=1, max_size=4))
def test_the_timer_plan_gives_each_named_message_its_fate_and_never_raises(records: list[dict[str, Any]]) -> None:
    due = START + timedelta(seconds=5)
    messages = [BucketMessage(f"m{n}", "orders", b"x", epoch_ms(due), sent_at_ms=epoch_ms(SENT)) for n in range(5)]
    stored: dict[str, StoredRecord] = {}
    for n, item in enumerate(records):
        read = _record({"endpoint": {"S": "orders"}, "message_id": {"S": f"m{n}"}, **item})
        assert read is not None
        if is_live(read, START):
            stored[read.message_id] = read
    plan = plan_bucket([Found(m, "k") for m in messages], lambda destination: stored)
    outcome = {m.message_id: "deliver" for m in plan.keep}
    outcome |= {m.message_id: "move" for m in plan.moved} | {r.message.message_id: "error" for r in plan.unusable}
    assert len(outcome) + plan.cancelled == 5  # each message exactly one fate
    for n, item in enumerate(records):
        expected = fate(item, SENT, START)
        if expected.kind == "move" and expected.due == due:
            expected = Fate("deliver", applies=True)  # already at that time: left as it is
        assert outcome.get(f"m{n}", "drop") == expected.kind, (item, plan)
        assert (f"m{n}" in {r.message_id for r in plan.applied}) == expected.applies
    assert outcome["m4"] == "deliver"


@pytest.mark.moto
@settings(
    max_examples=END_TO_END,
    deadline=None,
    phases=PHASES,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(records=st.lists(items, min_size=1, max_size=3))
def test_the_timer_over_fuzzed_records_delivers_the_neighbours_and_holds_only_their_messages(
    moto_endpoint: str, sqs: Any, dynamodb: Any, records: list[dict[str, Any]]
) -> None:
    import boto3

    s3 = boto3.client(
        "s3", endpoint_url=moto_endpoint, region_name=REGION, aws_access_key_id="t", aws_secret_access_key="t"
    )
    tag = uuid.uuid4().hex[:10]
    orders = f"o{tag}"
    kept = _put_items(dynamodb, orders, records)
    store_records = DynamoDbCancellationStore(dynamodb, TABLE)
    settings_ = DelayedDeliverySettings(error_queue=f"e{tag}")
    s3.create_bucket(Bucket=f"records-{tag}")
    store = S3BucketStore(s3, f"records-{tag}", "dd/buckets", BucketLevel(1, 10, 2))
    sqs.create_queue(QueueName=orders)
    errors = sqs.create_queue(QueueName=f"e{tag}")["QueueUrl"]
    due = START + timedelta(seconds=3)
    named = [
        BucketMessage(f"m{n}", orders, f"body-{n}".encode(), epoch_ms(due), sent_at_ms=epoch_ms(SENT)) for n in range(4)
    ]
    store.write_due(named, START)
    clock = ManualClock(START)
    sends: list[tuple[datetime, dict[str, Any]]] = []

    def record_send(params: dict[str, Any], **_: Any) -> None:
        if str(params["QueueUrl"]).endswith("/" + orders):
            sends.extend((clock.now(), entry) for entry in params["Entries"])

    sqs.meta.events.register("provide-client-params.sqs.SendMessageBatch", record_send)
    try:
        timer = BucketTimer(
            store, sqs, settings_, clock, cancellations=CancellationCache(store_records, 0, clock=clock), owner=tag
        )
        results = []
        for _ in range(RUN_SECONDS):
            clock.advance(1)
            results.append(timer.run())
    finally:
        sqs.meta.events.unregister("provide-client-params.sqs.SendMessageBatch", record_send)
    assert sum(r.buckets_failed for r in results) == 0
    delivered = {entry["MessageBody"]: at + timedelta(seconds=entry.get("DelaySeconds", 0)) for at, entry in sends}
    assert len(delivered) == len(sends)  # nothing sent twice
    held = _drain(sqs, errors)
    waiting = {
        m.message_id for lvl in ("fine", "coarse") for o in store.objects(lvl) for m in store.read(o.key).messages
    }
    remaining = {r.message_id for r in store_records.live(orders)}
    surely_sent = START + timedelta(seconds=RUN_SECONDS - 2)  # moved before this: sent in the run; until +12 s: maybe
    for n in range(4):
        item = kept.get(n)
        expected = fate(item, SENT, START) if item is not None else Fate("deliver")
        body = f"body-{n}"
        if expected.kind == "move" and expected.due is not None and expected.due <= surely_sent:
            expected = Fate("deliver", expected.due, True)
        if expected.kind == "deliver":
            assert body in delivered, (item, held)
            assert delivered[body] >= (expected.due or due), (item, delivered[body])  # never early
        elif expected.kind == "error":
            assert held.get(body), (item, held)
        elif expected.kind == "move":
            assert expected.due is not None
            sent_now = body in delivered and delivered[body] >= expected.due
            assert f"m{n}" in waiting or (sent_now and expected.due <= surely_sent + timedelta(seconds=4)), item
        else:
            assert body not in delivered and body not in held and f"m{n}" not in waiting, item
        if item is not None:
            assert (f"m{n}" in remaining) == (not expected.applies), (item, remaining)
    assert "body-3" in delivered  # the neighbour, without a record
    assert len(held) == sum(1 for n in kept if fate(kept[n], SENT, START).kind == "error")


@pytest.mark.moto
@settings(
    max_examples=END_TO_END,
    deadline=None,
    phases=PHASES,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(records=st.lists(items, min_size=1, max_size=3))
def test_the_requeue_function_over_fuzzed_records_retries_nothing_and_holds_only_their_messages(
    sqs: Any, dynamodb: Any, records: list[dict[str, Any]]
) -> None:
    queue = f"fz{uuid.uuid4().hex[:10]}"
    endpoint = ensure_endpoint(sqs, queue, lab_settings(queue), visibility_timeout=1)
    kept = _put_items(dynamodb, queue, records)
    env = {**handler_env(lab_settings(queue)), "DELAYED_DELIVERY_CANCELLATION_TABLE": TABLE}
    env["DELAYED_DELIVERY_CANCELLATION_CACHE_SECONDS"] = "0"
    handler = build_handler(env, sqs_client=sqs, dynamodb_client=dynamodb)
    now = datetime.now(UTC)
    sent = now - timedelta(seconds=10)
    batch = [_fifo_record(endpoint.delay_arn, f"m{n}", f"body-{n}", sent) for n in range(4)]
    moved_on: list[str] = []

    def record_send(params: dict[str, Any], **_: Any) -> None:
        if params["QueueUrl"] in (endpoint.input_url, endpoint.delay_url):
            moved_on.extend(e["MessageBody"] for e in params.get("Entries", [params]))

    for event in ("SendMessageBatch", "SendMessage"):
        sqs.meta.events.register(f"provide-client-params.sqs.{event}", record_send)
    try:
        response = handler({"Records": batch}, LocalLambdaContext())
    finally:
        for event in ("SendMessageBatch", "SendMessage"):
            sqs.meta.events.unregister(f"provide-client-params.sqs.{event}", record_send)
    assert response.get("batchItemFailures") == [], response
    held = _drain(sqs, endpoint.error_url)
    remaining = {r.message_id for r in DynamoDbCancellationStore(dynamodb, TABLE).live(queue)}
    for n in range(4):
        item = kept.get(n)
        expected = fate(item, sent, now, timer=False) if item is not None else Fate("deliver")
        body = f"body-{n}"
        went_on = any(body in text for text in moved_on)  # alone, or inside a packed envelope
        if expected.kind in ("deliver", "move"):
            assert went_on and body not in held, (item, held, moved_on)
        elif expected.kind == "error":
            assert held.get(body) and not went_on, (item, held, moved_on)
        else:
            assert not went_on and body not in held, item
        if item is not None:
            assert (f"m{n}" in remaining) == (not expected.applies), (item, remaining)


def _put_items(dynamodb: Any, endpoint: str, records: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Write each item for message ``m<n>`` of ``endpoint``; those DynamoDB refuses (a number it cannot store)
    cannot be in a table and are left out. The items written, by ``n``."""
    written: dict[int, dict[str, Any]] = {}
    for n, item in enumerate(records):
        key = {"endpoint": {"S": endpoint}, "message_id": {"S": f"m{n}"}}
        try:
            dynamodb.put_item(TableName=TABLE, Item={**item, **key})
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "ValidationException":
                raise
            continue
        written[n] = item
    return written


def _fifo_record(arn: str, message_id: str, body: str, sent: datetime) -> dict[str, Any]:
    """A ``-delay.fifo`` record of the sender's first hop with 1 s left (it moves on now)."""
    attributes = {DELAY_SECONDS_ATTRIBUTE: ("Number", "1")}
    return fifo_record(body, arn=arn, group=message_id, sent_ms=epoch_ms(sent), attributes=attributes)


def _drain(sqs: Any, url: str) -> dict[str, str]:
    """Every message on the queue at ``url``: body -> failure reason (empty when it has none)."""
    got = drain(sqs, url, timeout=0)
    return {m["Body"]: m.get("MessageAttributes", {}).get(FAILURE_REASON, {}).get("StringValue", "") for m in got}
