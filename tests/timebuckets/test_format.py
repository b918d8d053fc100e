"""The S3 bucket object: a round trip keeps every field; a bad line is poison, a bad object a problem; never raises."""

from __future__ import annotations

import base64
import gzip
import json
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayed_delivery.errors import InvalidMessageError
from delayed_delivery.timebuckets import format as bucket_format
from delayed_delivery.timebuckets import object_reader, object_writer
from delayed_delivery.timebuckets.format import (
    FORMAT_VERSION,
    MAX_OBJECT_MESSAGES,
    BucketMessage,
    bucket_object_key,
    decode_bucket,
    encode_bucket,
)
from delayed_delivery.timebuckets.wheel import COARSE, FINE, BucketKey, BucketLevel

BUCKET = BucketKey(FINE, datetime(2031, 2, 3, 4, 5, tzinfo=UTC))
START_MS = 1_927_857_900_000
HEADER = {"v": 1, "level": "fine", "bucket": "2031-02-03T04:05:00Z", "count": 1}
GOOD = {
    "id": "m1",
    "destination": "orders",
    "body": "aGk=",
    "attributes": {"k": ["String", "s", "v"]},
    "due_at_ms": START_MS,
    "hops": 0,
    "sent_at_ms": None,
}

attributes = st.dictionaries(
    st.text(min_size=1, max_size=20),
    st.one_of(
        st.builds(lambda t: {"DataType": "String", "StringValue": t}, st.text(max_size=50)),
        st.builds(lambda b: {"DataType": "Binary", "BinaryValue": b}, st.binary(max_size=50)),
    ),
    max_size=10,
)
messages = st.builds(
    BucketMessage,
    message_id=st.text(min_size=1, max_size=128).filter(str.strip),
    destination=st.from_regex(r"[A-Za-z0-9_.-]{1,80}", fullmatch=True),
    body=st.binary(max_size=300) | st.text(max_size=300).map(lambda t: t.encode("utf-8", "surrogatepass")),
    due_at_ms=st.integers(START_MS, START_MS + 59_999),
    attributes=attributes,
    hops=st.integers(0, 1_000),
    sent_at_ms=st.none() | st.integers(0, START_MS),
)


def _object(*lines: object, header: object = HEADER) -> bytes:
    text = "\n".join(json.dumps(x) if not isinstance(x, str) else x for x in (header, *lines))
    return gzip.compress(text.encode("utf-8") + b"\n", mtime=0)


@given(st.lists(messages, min_size=1, max_size=12, unique_by=lambda m: m.message_id))
def test_round_trip_keeps_every_field_in_due_order(batch: list[BucketMessage]) -> None:
    contents = decode_bucket(encode_bucket(BUCKET, batch))
    assert contents.complete and (contents.version, contents.bucket, contents.count) == (2, BUCKET, len(batch))
    assert list(contents.messages) == sorted(batch, key=lambda m: (m.due_at_ms, m.message_id))
    assert encode_bucket(BUCKET, list(reversed(batch))) == encode_bucket(BUCKET, batch)  # a retry writes the same
    assert bucket_object_key("p", BUCKET, list(reversed(batch))) == bucket_object_key("p", BUCKET, batch)


def test_writer_refuses_what_a_reader_could_not_use() -> None:
    message = BucketMessage("m1", "orders", b"x", START_MS)
    assert decode_bucket(encode_bucket(BUCKET, [message, message])).count == 1  # an exact duplicate is dropped
    with pytest.raises(InvalidMessageError, match="two different messages"):
        encode_bucket(BUCKET, [message, BucketMessage("m1", "orders", b"y", START_MS)])
    with pytest.raises(InvalidMessageError, match="not due within"):
        encode_bucket(BUCKET, [BucketMessage("m2", "orders", b"x", START_MS + 60_000)])
    with pytest.raises(InvalidMessageError, match="1 to"):
        encode_bucket(BUCKET, [])
    coarse = BucketKey(COARSE, datetime(2031, 2, 3, tzinfo=UTC))
    assert decode_bucket(encode_bucket(coarse, [message], BucketLevel())).bucket == coarse


@pytest.mark.parametrize(
    "kwargs",
    [
        {"message_id": ""},
        {"message_id": "x" * 129},
        {"destination": "no spaces"},
        {"body": "text"},
        {"due_at_ms": -1},
        {"due_at_ms": True},
        {"hops": -1},
        {"sent_at_ms": 1.5},
        {"attributes": {"k": {"DataType": "String"}}},
        {"attributes": {f"k{i}": {"DataType": "String", "StringValue": "v"} for i in range(11)}},
    ],
)
def test_a_message_is_validated(kwargs: dict[str, object]) -> None:
    fields: dict[str, object] = {"message_id": "m", "destination": "orders", "body": b"", "due_at_ms": START_MS}
    with pytest.raises(InvalidMessageError):
        BucketMessage(**(fields | kwargs))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("not json", "not JSON"),
        ("[1, 2]", "not an object"),
        (GOOD | {"body": "@@@"}, "not base64"),
        (GOOD | {"id": 7}, "message id"),
        (GOOD | {"destination": "a b"}, "queue name"),
        (GOOD | {"due_at_ms": "soon"}, "due_at_ms"),
        (GOOD | {"hops": -2}, "hops"),
        (GOOD | {"attributes": {"k": ["String", "z", "v"]}}, "unknown kind"),
        (GOOD | {"attributes": {"k": {"deep": {"deeper": [1]}}}}, "nested"),
        ({k: v for k, v in GOOD.items() if k != "hops"}, "missing hops"),
    ],
)
def test_a_bad_line_is_poison_and_the_others_are_read(line: object, reason: str) -> None:
    data = _object(GOOD | {"id": "before"}, line, GOOD | {"id": "after"}, header=HEADER | {"count": 3})
    contents = decode_bucket(data)
    assert [m.message_id for m in contents.messages] == ["before", "after"]
    [poison] = contents.poison
    assert poison.line == 2 and reason in poison.reason
    assert poison.message_id == (line.get("id") if isinstance(line, dict) and line.get("id") == "m1" else None)
    assert contents.problem is None and not contents.complete


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"", "not a gzip object"),
        (b"plain text", "not a gzip object"),
        (gzip.compress(b"", mtime=0), "empty object"),
        (_object(header="{broken"), "not JSON"),
        (_object(header={"v": 3, "level": "fine", "bucket": "x", "count": 0}), "version 3"),
        (_object(header=HEADER | {"v": True}), "version True"),
        (_object(header=HEADER | {"count": -1}), "count"),
        (_object(header=HEADER | {"level": "warm"}), "unknown bucket level"),
        (_object(header=HEADER | {"bucket": "tomorrow"}), "of the form"),
        (_object(GOOD, GOOD | {"id": "m2"}), "announces 1 messages, the object has 2"),
        (_object(GOOD)[:-12], "cut short"),
        (_object(GOOD) + b"junk", "after the end"),
        ("text", "expected bytes"),
    ],
)
def test_a_bad_object_is_a_problem_never_an_exception(data: bytes, problem: str) -> None:
    contents = decode_bucket(data)
    assert contents.problem is not None and problem in contents.problem
    assert not contents.complete


def test_reading_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(object_reader, "MAX_DECODED_BYTES", 1_000)  # the bound where the reader reads it
    contents = decode_bucket(gzip.compress(b"\n".join([json.dumps(HEADER).encode()] + [b"x" * 100] * 100_000)))
    assert contents.problem is not None and "1,000 bytes" in contents.problem
    assert len(contents.poison) < 20  # read only as far as the bound
    monkeypatch.undo()
    many = _object(*([GOOD] * (MAX_OBJECT_MESSAGES + 5)), header=HEADER | {"count": MAX_OBJECT_MESSAGES})
    contents = decode_bucket(many)
    assert len(contents.messages) == MAX_OBJECT_MESSAGES
    assert contents.problem is not None and "announces" in contents.problem
    too_long = GOOD | {"body": "QUJD" * 400_000}
    [poison] = decode_bucket(_object(too_long)).poison
    assert "characters of JSON" in poison.reason and poison.message_id == "m1"


def _lines(data: bytes) -> list[dict[str, object]]:
    return [json.loads(line) for line in gzip.decompress(data).decode("utf-8").splitlines()]


def _v1_line(message: BucketMessage) -> bytes:
    """The line a v1 writer wrote for ``message`` (the body always base64)."""
    line = object_writer._line(message)
    line.pop("t", None)
    line = {
        "id": line["id"],
        "destination": line["destination"],
        "body": base64.b64encode(message.body).decode(),
    } | line
    return object_writer._dumps(line).encode("utf-8")


def test_v2_writes_a_text_body_as_text_and_other_bytes_as_base64() -> None:
    text = BucketMessage("a", "orders", '{"order":42,"name":"Zoë ✓"}'.encode(), START_MS)
    binary = BucketMessage("b", "orders", b"\xff\x00\xfe", START_MS + 1)
    escapes = BucketMessage("c", "orders", b"\x01\x02\x03\x04\x05\x06", START_MS + 2)  # \u0001...: longer than base64
    empty = BucketMessage("d", "orders", b"", START_MS + 3)
    header, *lines = _lines(encode_bucket(BUCKET, [text, binary, escapes, empty]))
    assert header == {"v": FORMAT_VERSION, "level": "fine", "bucket": "2031-02-03T04:05:00Z", "count": 4}
    assert FORMAT_VERSION == 2
    assert [(line.get("t"), line.get("body")) for line in lines] == [
        ('{"order":42,"name":"Zoë ✓"}', None),
        (None, "/wD+"),
        (None, "AQIDBAUG"),
        ("", None),
    ]
    assert list(lines[0])[:3] == ["id", "destination", "t"]  # the id first: a damaged line still names it
    assert decode_bucket(encode_bucket(BUCKET, [text, binary, escapes, empty])).messages == (
        text,
        binary,
        escapes,
        empty,
    )


@given(messages)
def test_a_v2_line_is_never_longer_than_the_v1_line(message: BucketMessage) -> None:
    assert bucket_format.encoded_line_bytes(message) <= len(_v1_line(message)) + 1


def test_a_v1_object_is_still_read() -> None:
    contents = decode_bucket(_object(GOOD, GOOD | {"id": "m2", "t": "ignored in v1"}, header=HEADER | {"count": 2}))
    assert contents.complete and contents.version == 1
    assert [m.body for m in contents.messages] == [b"hi", b"hi"]
    v1_text = {k: v for k, v in GOOD.items() if k != "body"} | {"t": "hi"}
    [poison] = decode_bucket(_object(v1_text)).poison  # "t" is a v2 field
    assert "missing body" in poison.reason


V2_HEADER = HEADER | {"v": 2}
V2_GOOD = {k: v for k, v in GOOD.items() if k != "body"} | {"t": "hi ✓"}


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (V2_GOOD | {"body": "aGk="}, "both t and body"),
        ({k: v for k, v in V2_GOOD.items() if k != "t"}, "missing t or body"),
        (V2_GOOD | {"t": 7}, "is not text"),
        (V2_GOOD | {"t": "a\ud800b"}, "lone surrogate"),
        ({k: v for k, v in V2_GOOD.items() if k != "t"} | {"body": "@@"}, "not base64"),
        ({k: v for k, v in V2_GOOD.items() if k != "hops"}, "missing hops"),
    ],
)
def test_a_bad_v2_line_is_poison(line: dict[str, object], reason: str) -> None:
    data = _object(V2_GOOD | {"id": "before"}, line, V2_GOOD | {"id": "after"}, header=V2_HEADER | {"count": 3})
    contents = decode_bucket(data)
    assert [(m.message_id, m.body) for m in contents.messages] == [
        ("before", "hi ✓".encode()),
        ("after", "hi ✓".encode()),
    ]
    [poison] = contents.poison
    assert poison.line == 2 and reason in poison.reason and poison.message_id == "m1"
    assert contents.problem is None


def test_a_v2_object_reads_base64_bodies_too() -> None:
    binary = {k: v for k, v in V2_GOOD.items() if k != "t"} | {"body": "/wD+"}
    [message] = decode_bucket(_object(binary, header=V2_HEADER)).messages
    assert message.body == b"\xff\x00\xfe"
