"""Release control on the ``-delay.fifo`` route, on moto: the shared calendar of release slots in DynamoDB, and the
requeue function forwarding each capped message with ``DelaySeconds`` to its slot (or requeuing it when no slot is
free within the native cap)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import TYPE_CHECKING, Any

import boto3
import pytest
from botocore.config import Config

from delayed_delivery.aws.config import RELEASE_TABLE_ENV
from delayed_delivery.aws.release_calendar import Placement, ReleaseCalendar, ensure_release_table
from delayed_delivery.aws.requeue import HopOutcome, RecordResult
from delayed_delivery.aws.requeue.handler import build_handler
from delayed_delivery.aws.sender import SqsDelayedSender
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.errors import ConfigurationError
from delayed_delivery.ports import ReleaseSchedule
from delayed_delivery.release import ReleaseRates, second_capacity
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.testing.aws import LocalEventSourcePoller
from delayed_delivery.testing.release_contract import OpenSchedule, Race, ReleaseScheduleContract
from tests.aws.conftest import collect, handler_env
from tests.aws.interleave import run_interleaved
from tests.fixtures.moto import REGION

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_sqs import SQSClient

    from delayed_delivery.aws.queues import EndpointQueues

pytestmark = pytest.mark.moto

T0_MS = 1_893_456_000_000  # 2030-01-01T00:00:00Z, a whole second


@pytest.fixture
def release_table(dynamodb_endpoint: str) -> tuple[DynamoDBClient, str]:
    client = boto3.client(
        "dynamodb",
        endpoint_url=dynamodb_endpoint,
        region_name=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(connect_timeout=5, read_timeout=30, retries={"total_max_attempts": 3}),
    )
    name = f"release-{time.monotonic_ns()}"
    ensure_release_table(client, name)
    return client, name


class TestReleaseCalendarContract(ReleaseScheduleContract):
    """The release schedule contract over the calendar (one table per test, every handle on it)."""

    granularity = 1.0  # whole seconds: a second holds its share of the rate, wherever in it they land

    @pytest.fixture
    def open_schedule(self, release_table: tuple[DynamoDBClient, str]) -> OpenSchedule:
        client, table = release_table
        return lambda rates: ReleaseCalendar(client, table, rates)

    @pytest.fixture
    def race(self, release_table: tuple[DynamoDBClient, str]) -> Race:
        """Whole requests interleaved, one at a time: moto server applies ``UpdateItem ADD`` without a lock (see
        ``test_concurrent_invocations_never_overfill_a_second``); threads there lose updates DynamoDB would not."""
        client, table = release_table

        def run(rates: ReleaseRates, callers: Sequence[Callable[[ReleaseSchedule], None]]) -> None:
            def on_proxy(caller: Callable[[ReleaseSchedule], None]) -> Callable[[DynamoDBClient], None]:
                return lambda proxy: caller(ReleaseCalendar(proxy, table, rates))

            run_interleaved(client, [on_proxy(c) for c in callers], seed=7)

        return run


def _taken(client: DynamoDBClient, table: str, destination: str) -> dict[int, int]:
    items = client.query(
        TableName=table,
        KeyConditionExpression="destination = :d",
        ExpressionAttributeValues={":d": {"S": destination}},
    )["Items"]
    return {int(i["second"]["N"]): int(i["taken"]["N"]) for i in items if int(i["second"]["N"]) >= 0}


def test_a_burst_fills_whole_seconds_at_the_rate_in_due_order(release_table: tuple[DynamoDBClient, str]) -> None:
    client, table = release_table
    calendar = ReleaseCalendar(client, table, ReleaseRates.of({"orders": 200}))
    dues = [T0_MS + 3_000 + i for i in range(1000)]  # due over a millisecond each, all in one second
    now = T0_MS + 250
    placed = calendar.place("orders", dues, now)
    assert all(p is not None for p in placed)
    delays = [p.delay_seconds for p in placed if p is not None]
    assert delays == sorted(delays), "due order kept"
    assert Counter(delays) == {3: 200, 4: 200, 5: 200, 6: 200, 7: 200}
    assert all(T0_MS + 250 + d * 1000 >= due for d, due in zip(delays, dues, strict=True)), "never before due"
    lags = [p.lag for p in placed if p is not None]
    assert max(lags) == pytest.approx(7.25 - 3.8, abs=0.01)  # m-800: due 3.800 s, visible 7.25 s
    assert calendar.lag("orders", now) == 0.0, "seconds 0-2 are free: a message due now is not held back"
    (after,) = calendar.place("orders", [T0_MS], now)
    assert after is not None and after.delay_seconds == 0
    assert calendar.lag("orders", now + 3000) == pytest.approx(8 - 3.25, abs=0.01), "from 3 s on, seconds 3-7 are full"


def test_a_burst_at_a_low_rate_costs_one_update_per_second_it_fills(release_table: tuple[DynamoDBClient, str]) -> None:
    """At 1 a second, 30 messages due at once fill 30 seconds: one ``UpdateItem`` each (and one to record the full
    run), never an ask for all that wait followed by a give-back of the excess (60 calls before)."""
    client, table = release_table
    calendar = ReleaseCalendar(client, table, ReleaseRates.of({"slow": 1}))
    updates: list[str] = []
    client.meta.events.register("before-call.dynamodb.UpdateItem", lambda **_: updates.append("update"))
    placed = calendar.place("slow", [T0_MS] * 30, T0_MS)
    assert [p.delay_seconds for p in placed if p is not None] == list(range(30)), "one a second, from now"
    assert len(updates) <= 31, f"{len(updates)} UpdateItem calls for 30 seconds filled"
    assert sum(_taken(client, table, "slow").values()) == 30


@pytest.mark.parametrize("seed", range(4))
def test_concurrent_invocations_never_overfill_a_second(release_table: tuple[DynamoDBClient, str], seed: int) -> None:
    """12 invocations placing 10 messages each, their requests interleaved in an order the seed decides (one request
    at a time: moto server applies UpdateItem ADD without a lock, so overlapping ADDs lose updates there, while
    DynamoDB applies each atomically; docs/testing.md). Interleaved whole requests are what the calendar must hold
    under: an ADD between another invocation's ADD and its give-back, a full run marked while others probe."""
    client, table = release_table
    rates = ReleaseRates.of({"orders": 25.5})
    placed: list[int] = []

    def invocation(proxy: DynamoDBClient) -> None:
        got = ReleaseCalendar(proxy, table, rates).place("orders", [T0_MS] * 10, T0_MS)
        placed.extend(p.delay_seconds for p in got if p is not None)

    order = run_interleaved(client, [invocation] * 12, seed)
    switches = sum(a != b for a, b in pairwise(order))
    assert switches > len(order) // 2, f"the requests of the invocations interleave: {order}"
    assert len(placed) == 120
    per_second = Counter(placed)
    assert all(count <= second_capacity(25.5, T0_MS // 1000 + s) for s, count in per_second.items()), per_second
    assert sum(_taken(client, table, "orders").values()) == 120, "what was given back is not counted"
    assert max(per_second) <= 4, "the seconds fill up front to back: 25 + 26 + 25 + 26 + 25 >= 120"


def test_no_second_within_the_native_cap_means_no_slot(release_table: tuple[DynamoDBClient, str]) -> None:
    client, table = release_table
    calendar = ReleaseCalendar(client, table, ReleaseRates.of({"*": 1, "free": None}), horizon=5)
    placed = calendar.place("orders", [T0_MS] * 8, T0_MS)
    assert [p.delay_seconds if p else None for p in placed] == [0, 1, 2, 3, 4, 5, None, None]
    assert calendar.place("free", [T0_MS + 1500], T0_MS) == [Placement(2, 0.0)], "uncapped: its own delay"


def test_an_earlier_due_time_placed_later_is_not_pushed_behind_later_ones(
    release_table: tuple[DynamoDBClient, str],
) -> None:
    client, table = release_table
    calendar = ReleaseCalendar(client, table, ReleaseRates.of({"orders": 1}))
    late = calendar.place("orders", [T0_MS + 500_000], T0_MS)[0]
    early = calendar.place("orders", [T0_MS + 10_000], T0_MS + 1_000)[0]
    assert late is not None and early is not None
    assert (late.delay_seconds, early.delay_seconds) == (500, 9), "a calendar, not a pointer"


def _send_burst(sender: SqsDelayedSender, n: int, delay: int) -> None:
    for i in range(n):
        sender.send_delayed("orders", f"m-{i:03d}", delay, message_id=f"m-{i:03d}")


def _fill(client: DynamoDBClient, table: str, destination: str, seconds: range, *, delete: bool = False) -> None:
    """Mark ``seconds`` of ``destination`` full, as an earlier burst's backlog would (or give them back)."""
    keys = [{"destination": {"S": destination}, "second": {"N": str(s)}} for s in seconds]
    for at in range(0, len(keys), 25):
        chunk = keys[at : at + 25]
        requests: list[Any] = (
            [{"DeleteRequest": {"Key": k}} for k in chunk]
            if delete
            else [{"PutRequest": {"Item": {**k, "taken": {"N": "1000000"}}}} for k in chunk]
        )
        client.batch_write_item(RequestItems={table: requests})


def test_the_requeue_function_forwards_a_capped_burst_at_the_rate(
    sqs: SQSClient,
    endpoint: EndpointQueues,
    sender: SqsDelayedSender,
    settings: DelayedDeliverySettings,
    sqs_settings: SqsSettings,
    release_table: tuple[DynamoDBClient, str],
) -> None:
    """A backlog longer than the native cap (the calendar full from now on, certain whatever the machine's speed)
    requeues the due messages to ask again after their hop; once seconds free up, the burst is forwarded at the rate,
    every message once."""
    client, table = release_table
    results: list[RecordResult] = []
    env = {**handler_env(settings, sqs_settings), "DELAYED_DELIVERY_RELEASE_RATES": '{"orders": 10}'}
    handler = build_handler(
        {**env, RELEASE_TABLE_ENV: table}, sqs_client=sqs, dynamodb_client=client, on_results=results.extend
    )
    backlog = range(int(time.time()) - 1, int(time.time()) + 600)  # far beyond any wait below
    _fill(client, table, "orders", backlog)
    poller = LocalEventSourcePoller(sqs, endpoint.delay_url, endpoint.delay_arn, handler).start()
    try:
        _send_burst(sender, 30, 3)  # compressed: hop and native cap 2 s
        deadline = time.monotonic() + 60
        while not any(r.release_wait for r in list(results)) and time.monotonic() < deadline:
            time.sleep(0.2)
        poller.stop()  # no invocation in flight while the backlog is given back
        waits = [m for r in results for m in r.per_message() if m.release_wait]
        assert waits and all(m.outcome is HopOutcome.REQUEUED for m in waits), "no slot within 2 s: requeued"
        assert not any(m.outcome is HopOutcome.FORWARDED for r in results for m in r.per_message())
        _fill(client, table, "orders", backlog, delete=True)
        poller.start()
        arrivals = collect(sqs, endpoint.input_url, expect=30, timeout=60)
    finally:
        poller.stop()
    assert (poller.stats.handler_errors, poller.stats.poll_errors) == (0, 0), poller.stats
    assert sorted(a.body for a in arrivals) == [f"m-{i:03d}" for i in range(30)], "every message, once"
    each = [m for r in results for m in r.per_message()]  # requeued together, they came back in an envelope
    forwarded = [r for r in each if r.outcome is HopOutcome.FORWARDED]
    assert len(forwarded) == 30 and all(r.release_lag_s is not None for r in forwarded)
    per_second = _taken(client, table, "orders")
    assert sum(per_second.values()) >= 30 and max(per_second.values()) <= 10


def test_release_rates_without_a_table_is_one_clear_error(
    make_poller: Callable[..., Any],
) -> None:
    with pytest.raises(ConfigurationError, match=RELEASE_TABLE_ENV):
        make_poller(env={"DELAYED_DELIVERY_RELEASE_RATES": '{"orders": 10}'})
