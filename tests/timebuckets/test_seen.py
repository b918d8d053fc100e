"""Seen snapshots (#31): what a dispatch worker met of its partition, written at a recorded point and read back by the
next worker (and by a later plan of the bucket); bounded and validated when read. Salted write-back keys."""

from __future__ import annotations

import gzip
import json
from datetime import UTC, datetime

import pytest

from delayed_delivery.aws.tier.plan_store import SeenName, seen_name
from delayed_delivery.aws.tier.timer_plan import Seen
from delayed_delivery.errors import InvalidMessageError
from delayed_delivery.timebuckets.format import BucketMessage, encode_bucket_object
from delayed_delivery.timebuckets.seen import SeenSnapshot, decode_seen, encode_seen
from delayed_delivery.timebuckets.wheel import FINE, BucketKey, parse_object_key_count
from tests.aws.tier.timer_support import message

BUCKET = BucketKey(FINE, datetime(2031, 2, 3, 4, 5, tzinfo=UTC))
SNAPSHOT = SeenSnapshot(BUCKET, 1_927_857_300_000, 1, 4, 2, 17, False, 3, (("a", 1, 2, False), ("b", 3, 4, True)))


def _text() -> list[str]:
    return gzip.decompress(encode_seen(SNAPSHOT)).decode("ascii").splitlines()


def _encoded(lines: list[str]) -> bytes:
    return gzip.compress(("\n".join(lines) + "\n").encode("ascii"))


def test_a_snapshot_reads_back_as_written() -> None:
    assert decode_seen(encode_seen(SNAPSHOT)) == SNAPSHOT
    assert SNAPSHOT.position == (2, 17)
    assert encode_seen(SNAPSHOT) == encode_seen(SNAPSHOT)  # the same snapshot, the same bytes


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda lines: lines[:2], "announces 2 entries, it holds 1"),
        (lambda lines: [lines[0].replace("seen/1", "seen/9"), *lines[1:]], "format is not"),
        (lambda lines: [lines[0], '["a",1,"xyz",0]', lines[2]], "digest"),
        (lambda lines: [lines[0], '["a",1,"0000000000000002",2]', lines[2]], "written back"),
        (lambda lines: [lines[0], '["a",1,"0000000000000002",true]', lines[2]], "written back"),
        (lambda lines: [lines[0], '[" ",1,"0000000000000002",0]', lines[2]], "not a message id"),
        (lambda lines: [lines[0], '["a",-1,"0000000000000002",0]', lines[2]], "epoch milliseconds"),
        (lambda lines: [lines[0], '{"id":"a"}', lines[2]], r"not \[id, due"),
        (lambda lines: [json.dumps({**json.loads(lines[0]), "partition": 4}), *lines[1:]], "partition"),
        (
            lambda lines: [json.dumps({k: v for k, v in json.loads(lines[0]).items() if k != "line"}), *lines[1:]],
            "missing line",
        ),
    ],
)
def test_a_damaged_snapshot_is_refused_with_its_reason(change: object, reason: str) -> None:
    with pytest.raises(InvalidMessageError, match=reason):
        decode_seen(_encoded(change(_text())))  # type: ignore[operator]


def test_what_is_not_a_snapshot_is_refused() -> None:
    for data in (b"", b"not gzip", gzip.compress(b""), gzip.compress(b"\xff\xfe"), encode_seen(SNAPSHOT)[:-9]):
        with pytest.raises(InvalidMessageError):
            decode_seen(data)


def test_a_write_back_key_is_apart_from_the_same_content_unsalted_and_read_as_any() -> None:
    message = BucketMessage("m-1", "orders", b"x", int(BUCKET.start.timestamp() * 1000) + 5)
    plain, data = encode_bucket_object("p", BUCKET, [message])
    salted, same = encode_bucket_object("p", BUCKET, [message], salt="2031-02-03T04:05:00Z@1")
    again, _ = encode_bucket_object("p", BUCKET, [message], salt="2031-02-03T04:05:00Z@1")
    other, _ = encode_bucket_object("p", BUCKET, [message], salt="2031-02-03T04:05:00Z@2")
    assert same == data and salted == again and len({plain, salted, other}) == 3
    assert parse_object_key_count(salted) == parse_object_key_count(plain)._replace(
        content_hash=parse_object_key_count(salted).content_hash
    )


def test_a_delta_reads_back_and_a_whole_snapshot_keeps_its_bytes() -> None:
    delta = SeenSnapshot(BUCKET, 1_927_857_300_000, 1, 4, 2, 17, False, 3, (("b", 3, 4, True),), delta=True)
    assert decode_seen(encode_seen(delta)) == delta
    assert '"delta"' not in _text()[0]  # a whole snapshot is written as before deltas
    header = json.loads(gzip.decompress(encode_seen(delta)).decode("ascii").splitlines()[0])
    with pytest.raises(InvalidMessageError, match="delta must be true or false"):
        decode_seen(_encoded([json.dumps({**header, "delta": 1}), '["b",3,"0000000000000004",1]']))


def test_seen_keys_name_their_plan_partition_and_point() -> None:
    assert seen_name("p/seen/fine/2031-02-03T04:05:00Z/1927857300000-3.jsonl.gz") == SeenName(1927857300000, 3, None)
    assert seen_name("p/seen/fine/x/1927857300000-12-4-250.jsonl.gz") == SeenName(1927857300000, 12, (4, 250))
    for stranger in ("p/seen/fine/x/notes.txt", "p/seen/fine/x/1-2-3.jsonl.gz", "p/seen/fine/x/-1-2.jsonl.gz"):
        assert seen_name(stranger) is None


def test_what_a_partition_met_since_its_last_delta_is_fresh_once() -> None:
    due = datetime(2031, 2, 3, 4, 5, 30, tzinfo=UTC)
    seen = Seen()
    a, b = message(1, due), message(2, due)
    seen.admit(a)
    [entry] = seen.take_fresh()
    assert entry[:2] == (a.message_id, a.due_at_ms) and entry[3] is False and seen.take_fresh() == ()
    seen.admit(b)
    seen.admit(a)  # met before: not fresh again
    seen.written_back([a])  # but marked written back since: in the next delta, marked
    fresh = {e[0]: e[3] for e in seen.take_fresh()}
    assert fresh == {a.message_id: True, b.message_id: False}
    again = Seen()
    again.load([(a.message_id, a.due_at_ms, entry[2], False)])
    again.load([(a.message_id, a.due_at_ms, entry[2], True)])  # a later delta's mark holds
    assert again.take_fresh() == () and again.entries()[0][3] is True
