"""The timer's per-bucket plan (pure): one message per id, the first sent wins, records applied and bound."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from delayed_delivery.cancellations import (
    Cancellation,
    CancellationKind,
    StoredRecord,
    UnreadableRecord,
    cancel_request,
    reschedule_request,
)
from delayed_delivery.delivery import epoch_ms
from delayed_delivery.timebuckets.apply import Found, plan_bucket
from delayed_delivery.timebuckets.format import BucketMessage
from delayed_delivery.timebuckets.identity import content_digest, same_message

NOW = datetime(2031, 1, 1, tzinfo=UTC)


def _m(message_id: str, body: bytes = b"x", sent: int | None = 1, hops: int = 0) -> BucketMessage:
    return BucketMessage(message_id, "orders", body, epoch_ms(NOW), sent_at_ms=sent, hops=hops)


def test_copies_are_counted_and_the_first_sent_wins_a_conflict() -> None:
    found = [
        Found(_m("a"), "k2"),
        Found(_m("a", hops=3, sent=5), "k1"),  # the same message, moved more often: a copy
        Found(_m("b", b"late", sent=9), "k1"),
        Found(_m("b", b"unknown send time", sent=None), "k0"),
        Found(_m("b", b"early", sent=2), "k9"),
    ]
    plan = plan_bucket(found)
    assert [(m.message_id, m.body) for m in plan.keep] == [("a", b"x"), ("b", b"early")]
    assert plan.keep[0].sent_at_ms == 1  # the first sent copy
    assert plan.duplicates == 1
    assert sorted(r.message.body for r in plan.conflicts) == [b"late", b"unknown send time"]
    assert all("'b'" in r.reason and "k9" in r.reason for r in plan.conflicts)
    assert {r.key for r in plan.conflicts} == {"k1", "k0"}
    assert same_message(_m("a"), _m("a", hops=2, sent=7)) and not same_message(_m("a"), _m("a", b"y"))
    reason = next(r.reason for r in plan.conflicts if r.message.body == b"late")  # both versions named by digest
    assert f"digest {content_digest(_m('b', b'early'))}, in k9" in reason
    assert f"digest {content_digest(_m('b', b'late'))}, in k1" in reason


def test_records_cancel_and_move_only_the_messages_they_bind() -> None:
    sent = epoch_ms(NOW - timedelta(seconds=10))
    records: dict[str, StoredRecord] = {
        "c": cancel_request("orders", "c", now=NOW, max_native_delay=2, max_age=0),
        "r": reschedule_request("orders", "r", NOW + timedelta(hours=1), now=NOW),
        "later": cancel_request("orders", "later", now=NOW, max_native_delay=2, max_age=0),
        "done": reschedule_request("orders", "done", NOW, now=NOW - timedelta(seconds=1)),  # written before it fell due
    }
    found = [
        Found(_m("c", sent=sent), "k"),
        Found(_m("r", sent=sent), "k"),
        Found(_m("later", sent=epoch_ms(NOW + timedelta(seconds=5))), "k"),  # sent after the request
        Found(_m("done", sent=sent), "k"),  # already at the new due time: moved by an earlier run
        Found(_m("plain", sent=sent), "k"),
    ]
    plan = plan_bucket(found, lambda destination: records if destination == "orders" else {})
    assert sorted(m.message_id for m in plan.keep) == ["done", "later", "plain"]
    assert plan.cancelled == 1
    [moved] = plan.moved
    assert moved.message_id == "r" and moved.due_at == NOW + timedelta(hours=1) and moved.hops == 1
    assert sorted(r.message_id for r in plan.applied) == ["c", "done", "r"]


def test_a_record_that_cannot_be_used_holds_its_one_message_for_the_error_queue() -> None:
    sent = epoch_ms(NOW - timedelta(seconds=10))
    edge = Cancellation(  # inside 1970-9000, yet the new due time rounds to the first millisecond no bucket holds
        "orders", "edge", CancellationKind.RESCHEDULE, NOW, NOW, datetime(8999, 12, 31, 23, 59, 59, 999_900, tzinfo=UTC)
    )
    records: dict[str, StoredRecord] = {
        "bad": UnreadableRecord("orders", "bad", "requested_at '2030-01-01T00:00:00' is naive"),
        "edge": edge,
    }
    found = [Found(_m(name, sent=sent), "k") for name in ("bad", "edge", "plain")]
    plan = plan_bucket(found, lambda destination: records)
    assert [m.message_id for m in plan.keep] == ["plain"]
    held = {r.message.message_id: r.reason for r in plan.unusable}
    assert set(held) == {"bad", "edge"}
    assert "cannot be read (requested_at '2030-01-01T00:00:00' is naive)" in held["bad"]
    assert "cannot be applied" in held["edge"] and "9000" in held["edge"]
    assert sorted(r.message_id for r in plan.applied) == ["bad", "edge"]  # deleted once their messages are held
