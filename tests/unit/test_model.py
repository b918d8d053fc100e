from __future__ import annotations

import pickle
from datetime import UTC, datetime, timedelta, timezone

import pytest

from delayed_delivery import DelayedMessage, InvalidMessageError, ManualClock

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def test_due_at_is_normalised_to_utc() -> None:
    plus2 = timezone(timedelta(hours=2))
    m = DelayedMessage("id", "q", b"x", datetime(2030, 1, 1, 12, tzinfo=plus2))
    assert m.due_at == datetime(2030, 1, 1, 10, tzinfo=UTC)
    assert m.due_at.utcoffset() == timedelta(0)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"due_at": datetime(2030, 1, 1)}, "naive"),
        ({"destination": ""}, "destination"),
        ({"destination": "   "}, "destination"),
        ({"body": "text"}, "bytes"),
        ({"message_id": ""}, "message_id"),
        ({"message_id": "x" * 129}, "128"),
        ({"headers": {"a": 1}}, "str value"),
        ({"headers": {"": "x"}}, "non-empty"),
        ({"failure_count": -1}, "failure_count"),
    ],
)
def test_bad_input_raises_a_clear_error(kwargs: dict[str, object], needle: str) -> None:
    base: dict[str, object] = {"message_id": "id", "destination": "q", "body": b"x", "due_at": T0}
    with pytest.raises(InvalidMessageError, match=needle):
        DelayedMessage(**{**base, **kwargs})  # type: ignore[arg-type]


def test_message_is_frozen_hashable_and_picklable() -> None:
    m = DelayedMessage("id", "q", bytearray(b"x"), T0, {"k": "v"})  # type: ignore[arg-type]
    assert m.body == b"x"
    with pytest.raises(AttributeError):
        m.destination = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        m.headers["k"] = "w"  # type: ignore[index]
    assert pickle.loads(pickle.dumps(m)) == m
    assert hash(m) == hash(pickle.loads(pickle.dumps(m)))


def test_create_from_delay_uses_the_injected_clock() -> None:
    clock = ManualClock(T0)
    m = DelayedMessage.create("q", b"x", delay="2h", clock=clock)
    assert m.due_at == T0 + timedelta(hours=2)
    assert m.delay_from(T0) == 7200
    assert m.delay_from(T0 + timedelta(hours=3)) == 0
    assert len(m.message_id) == 36


def test_create_needs_exactly_one_of_delay_and_at() -> None:
    with pytest.raises(InvalidMessageError, match="exactly one"):
        DelayedMessage.create("q", b"x")
    with pytest.raises(InvalidMessageError, match="exactly one"):
        DelayedMessage.create("q", b"x", delay=1, at=T0)


def test_with_headers_and_redirected_return_copies() -> None:
    m = DelayedMessage("id", "q", b"x", T0, {"a": "1"})
    n = m.with_headers({"b": "2"}).redirected("error")
    assert dict(n.headers) == {"a": "1", "b": "2"} and n.destination == "error"
    assert dict(m.headers) == {"a": "1"} and m.destination == "q"


@pytest.mark.parametrize(
    "at",
    [
        datetime.max.replace(tzinfo=timezone(timedelta(hours=-5))),
        datetime.min.replace(tzinfo=timezone(timedelta(hours=5))),
    ],
    ids=["9999-12-31-05:00", "0001-01-01+05:00"],
)
def test_aware_datetime_outside_the_range_once_in_utc_is_invalid_not_overflow_error(at: datetime) -> None:
    # found by tests/reliability/test_sender_fuzz.py: astimezone(UTC) raised OverflowError out of create() and senders
    with pytest.raises(InvalidMessageError, match="outside the datetime range"):
        DelayedMessage.create("q", b"x", at=at)
    with pytest.raises(InvalidMessageError, match="outside the datetime range"):
        DelayedMessage("id", "q", b"x", at)


def test_delay_that_ends_past_year_9999_is_invalid_not_overflow_error() -> None:
    clock = ManualClock(datetime(9990, 1, 1, tzinfo=UTC))
    with pytest.raises(InvalidMessageError, match="past year 9999"):
        DelayedMessage.create("q", b"x", delay="100y", clock=clock)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"message_id": "id\ud800"},
        {"destination": "q\udfff"},
        {"headers": {"name\ud800": "v"}},
        {"headers": {"name": "\udc80value"}},
    ],
)
def test_lone_surrogates_are_invalid_in_ids_destinations_and_headers(kwargs: dict[str, object]) -> None:
    # found by tests/reliability/test_sender_fuzz.py: no store or queue can encode them (UnicodeEncodeError leaked)
    base: dict[str, object] = {"message_id": "id", "destination": "q", "body": b"x", "due_at": T0}
    with pytest.raises(InvalidMessageError, match="lone surrogate"):
        DelayedMessage(**{**base, **kwargs})  # type: ignore[arg-type]
    assert DelayedMessage("ïd ✓", "q", b"x", T0, {"ключ": "値 🎉"}).headers["ключ"] == "値 🎉"


@pytest.mark.parametrize(
    "name",
    ["DelayedDelivery.Unreadable", "DelayedDelivery.FailureReason", "DelayedDelivery.Envelope", "delayeddelivery.x"],
)
def test_create_refuses_reserved_headers_by_name(name: str) -> None:
    with pytest.raises(InvalidMessageError, match=name.replace(".", r"\.")):
        DelayedMessage.create("q", b"x", delay=1, headers={name: "x"})


def test_our_own_code_may_still_set_reserved_headers() -> None:
    from delayed_delivery.headers import FAILURE_REASON, UNREADABLE
    from delayed_delivery.model import unreadable_message

    assert DelayedMessage("id", "q", b"x", T0, {FAILURE_REASON: "r"}).headers[FAILURE_REASON] == "r"
    assert unreadable_message("id", "q", b"x", T0, "bad row").headers[UNREADABLE] == "bad row"
    m = DelayedMessage.create("q", b"x", delay=1).with_headers({FAILURE_REASON: "r"})
    assert m.headers[FAILURE_REASON] == "r"


@pytest.mark.parametrize(
    "at",
    [datetime(2500, 1, 1, tzinfo=UTC), datetime(9999, 1, 1, tzinfo=UTC), T0 + timedelta(days=36_526)],
    ids=["2500", "9999", "100y+1d"],
)
def test_create_caps_absolute_due_times_at_100_years(at: datetime) -> None:
    with pytest.raises(InvalidMessageError, match="100-year"):
        DelayedMessage.create("q", b"x", at=at, clock=ManualClock(T0))


def test_create_accepts_due_times_within_100_years_and_in_the_past() -> None:
    clock = ManualClock(T0)
    assert DelayedMessage.create("q", b"x", at=T0 + timedelta(days=36_525), clock=clock).due_at.year == 2130
    assert DelayedMessage.create("q", b"x", at=T0 - timedelta(days=1), clock=clock).due_at < T0


@pytest.mark.parametrize("destination", ["orders", "orders.fifo", "my_queue-1", "a" * 80, "billing-2024"])
def test_create_accepts_queue_names_both_clouds_can_use(destination: str) -> None:
    assert DelayedMessage.create(destination, b"x", delay=1).destination == destination


@pytest.mark.parametrize("destination", ["no such", "q/x", "a" * 81, "queue@machine", "caf\u00e9", "q\n"])
def test_create_refuses_destinations_that_are_no_queue_name(destination: str) -> None:
    with pytest.raises(InvalidMessageError, match="destination"):
        DelayedMessage.create(destination, b"x", delay=1)
