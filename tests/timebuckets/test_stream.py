"""The streaming reader of bucket objects: the same result as ``decode_bucket`` however the bytes arrive, one line
held at a time, bounded, and the same id for a line whoever reads it."""

from __future__ import annotations

import base64
import gzip
import json
import zlib
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayed_delivery.timebuckets import object_reader
from delayed_delivery.timebuckets.format import (
    MAX_LINE_BYTES,
    MAX_POISON_RAW_BYTES,
    BucketMessage,
    BucketStream,
    RawLine,
    decode_bucket,
    encode_bucket,
    line_id,
)
from tests.golden import wire
from tests.timebuckets.test_format import BUCKET, GOOD, HEADER, START_MS, _object, messages


def _chunked(data: bytes, cuts: list[int]) -> Iterator[bytes]:
    at = 0
    for cut in sorted(cuts):
        yield data[at:cut]
        at = cut
    yield data[at:]


def _streamed(data: bytes, cuts: list[int]) -> object:
    return BucketStream(_chunked(data, [c % (len(data) + 1) for c in cuts])).contents()


def _damaged(data: bytes, where: int, what: str) -> bytes:
    where %= len(data) + 1
    if what == "cut":
        return data[:where]
    if what == "flip":
        return data[:where] + bytes([data[where] ^ 0x41]) + data[where + 1 :] if where < len(data) else data
    return data + b"junk"


@given(
    st.lists(messages, min_size=1, max_size=8, unique_by=lambda m: m.message_id),
    st.lists(st.integers(0, 10_000), max_size=6),
    st.sampled_from(["none", "cut", "flip", "trail"]),
    st.integers(0, 10_000),
)
def test_any_chunking_and_damage_reads_as_decode_bucket_does(
    batch: list[BucketMessage], cuts: list[int], damage: str, where: int
) -> None:
    data = encode_bucket(BUCKET, batch)
    if damage != "none":
        data = _damaged(data, where, damage)
    whole = decode_bucket(data)
    streamed = _streamed(data, cuts)
    if damage == "flip":  # a damaged deflate stream: what came before the damage was already handed on
        assert (streamed.problem is None) == (whole.problem is None)  # type: ignore[attr-defined]
        assert whole.problem is not None or streamed == whole
        return
    assert streamed == whole
    if damage == "none":
        assert whole.complete and len(whole.messages) == len(batch)


@pytest.mark.parametrize(
    "data",
    [
        _object(GOOD, "not json", GOOD | {"id": "m2"}, header=HEADER | {"count": 3}),
        _object(GOOD, "", header=HEADER | {"count": 2}),
        gzip.compress(b"", mtime=0),
        b"",
        b"plain text",
        _object(header="{broken"),
        _object(GOOD, GOOD | {"id": "m2"}),
    ],
)
def test_hand_made_objects_read_the_same_in_one_byte_chunks(data: bytes) -> None:
    assert BucketStream(data[i : i + 1] for i in range(len(data))).contents() == decode_bucket(data)


def test_every_golden_object_reads_the_same_streamed() -> None:
    names = wire.versions("s3_bucket")
    assert len(names) >= 3
    for name in names:
        data = base64.b64decode(json.loads((wire.GOLDEN / name).read_text(encoding="utf-8"))["object"])
        streamed = _streamed(data, [7, 100, 1_000])
        assert streamed == decode_bucket(data) and streamed.complete and len(streamed.messages) == 3


def test_a_line_longer_than_a_reader_holds_is_poison_read_past() -> None:
    huge = json.dumps(GOOD | {"id": "big", "body": "Q" * (MAX_LINE_BYTES + 10)})
    data = _object(GOOD, huge, GOOD | {"id": "m3"}, header=HEADER | {"count": 3})
    stream = BucketStream(data[i : i + 65_536] for i in range(0, len(data), 65_536))
    items = list(stream.items())
    assert [getattr(i, "message_id", None) for i in items] == ["m1", "big", "m3"]
    poison = items[1]
    assert not isinstance(poison, BucketMessage)
    assert poison.line == 2 and "a line may hold" in poison.reason and poison.raw_size == len(huge)
    assert len(poison.raw) == MAX_POISON_RAW_BYTES and stream.problem is None


def test_the_stored_bytes_are_bounded_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(object_reader, "MAX_DECODED_BYTES", 1_000)  # the bound where the reader reads it
    empty_blocks = zlib.compressobj(wbits=31)
    head = empty_blocks.compress(json.dumps(HEADER).encode() + b"\n")
    head += empty_blocks.flush(zlib.Z_FULL_FLUSH)
    nothing = b"\x00\x00\x00\xff\xff" * 1_000  # empty stored deflate blocks: bytes that decompress to nothing
    stream = BucketStream([head, *[nothing] * 1_000])
    assert list(stream.lines()) == []
    assert stream.problem is not None and "bytes stored" in stream.problem


def test_a_stream_stops_where_its_reader_stops() -> None:
    batch = [BucketMessage(f"m{n}", "orders", b"x" * 100, START_MS + n) for n in range(1_000)]
    data = encode_bucket(BUCKET, batch)
    pulled = []

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(data), 64):
            pulled.append(i)
            yield data[i : i + 64]

    stream = BucketStream(chunks())
    assert stream.open() is not None and stream.header is not None and stream.header.count == 1_000
    first = next(stream.items())
    assert isinstance(first, BucketMessage) and first.message_id == "m0"
    assert len(pulled) < len(data) // 64 / 2  # the rest was never read


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b'{"id":"a\\u0042","destination":"q"}', "aB"),
        (b'{"destination":"q","id":"late"}', "late"),  # not first: read from the whole line
        (b'{"destination":"q"}', None),
        (b"not json", None),
        (b'{"id":""}', None),
        (b'{"id":"x' + b"y" * 600 + b'"}', None),  # over the id bound
    ],
)
def test_line_id_names_a_line_by_its_id(line: bytes, expected: str | None) -> None:
    assert line_id(RawLine(1, line, len(line))) == expected


def test_line_id_of_a_line_cut_for_length_is_its_leading_id() -> None:
    assert line_id(RawLine(1, b'{"id":"m9","body":"QQQQ', MAX_LINE_BYTES + 5)) == "m9"
    assert line_id(RawLine(1, b'{"body":"QQQQ","id":"m9"', MAX_LINE_BYTES + 5)) is None
