"""The ingest envelope: a round trip keeps every field; a bad entry is a BadItem with its reason; never raises."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayed_delivery.aws.sqs import NOT_SQS_TEXT, message_size
from delayed_delivery.aws.tier.ingest_format import (
    INGEST_ATTRIBUTE,
    MAX_INGEST_ENTRIES,
    BadItem,
    decode_ingest,
    encode_ingest,
    ingest_attributes,
    ingest_entry_bytes,
    pack_ingest,
)
from delayed_delivery.errors import InvalidMessageError
from delayed_delivery.timebuckets.format import BucketMessage

DUE = 1_927_857_900_000
GOOD: dict[str, Any] = {"i": "m1", "q": "orders", "b": "hi", "a": {"k": ["String", "s", "v"]}, "d": DUE, "s": 5}

sqs_text = st.text(min_size=1, max_size=60).filter(lambda t: NOT_SQS_TEXT.search(t) is None)
attributes = st.dictionaries(
    st.from_regex(r"[A-Za-z0-9_-]{1,20}", fullmatch=True).filter(lambda n: not n.lower().startswith("delayed")),
    st.one_of(
        st.builds(lambda t: {"DataType": "String", "StringValue": t}, sqs_text),
        st.builds(lambda b: {"DataType": "Binary", "BinaryValue": b}, st.binary(min_size=1, max_size=40)),
        st.builds(lambda n: {"DataType": "Number", "StringValue": str(n)}, st.integers()),
    ),
    max_size=10,
).filter(lambda a: not any(n.lower().startswith(("aws", "amazon")) for n in a))
messages = st.builds(
    BucketMessage,
    message_id=st.from_regex(r"[\x21-\x7e]{1,128}", fullmatch=True),
    destination=st.from_regex(r"[A-Za-z0-9_-]{1,80}", fullmatch=True),
    body=sqs_text.map(lambda t: t.encode("utf-8")),
    due_at_ms=st.integers(0, 220_898_663_999_999),
    attributes=attributes,
    sent_at_ms=st.none() | st.integers(0, DUE),
)


def _envelope(*items: Any) -> str:
    return json.dumps({"v": 1, "m": list(items)})


def _bad(body: str) -> BadItem:
    [item] = decode_ingest(body)
    assert isinstance(item, BadItem), item
    return item


@given(st.lists(messages, min_size=1, max_size=8))
def test_round_trip_keeps_every_field(batch: list[BucketMessage]) -> None:
    decoded = decode_ingest(encode_ingest(batch))
    assert decoded == batch
    for got, sent in zip(decoded, batch, strict=True):
        assert isinstance(got, BucketMessage)
        assert got.body == sent.body and dict(got.attributes) == dict(sent.attributes)


@given(st.text(max_size=300))
def test_any_text_decodes_without_raising(text: str) -> None:
    assert all(isinstance(item, BucketMessage | BadItem) for item in decode_ingest(text))


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
        lambda c: st.lists(c) | st.dictionaries(st.text(), c),
        max_leaves=20,
    )
)
def test_any_entry_decodes_without_raising(entry: Any) -> None:
    for item in decode_ingest(json.dumps({"v": 1, "m": [entry, GOOD]})):
        assert isinstance(item, BucketMessage | BadItem)


def test_the_wire_form_is_compact_json_with_short_keys() -> None:
    message = BucketMessage("m1", "orders", b"hi", DUE, {"k": {"DataType": "String", "StringValue": "v"}}, 0, 5)
    assert encode_ingest([message]) == json.dumps({"v": 1, "m": [GOOD]}, separators=(",", ":"))
    bare = BucketMessage("m2", "orders", "ü".encode(), DUE)
    assert encode_ingest([bare]) == '{"v":1,"m":[{"i":"m2","q":"orders","b":"ü","d":1927857900000}]}'
    assert ingest_attributes() == {INGEST_ATTRIBUTE: {"DataType": "String", "StringValue": "1"}}
    assert INGEST_ATTRIBUTE == "DelayedDelivery.Ingest"


def test_encoder_refuses_what_no_reader_could_use() -> None:
    with pytest.raises(InvalidMessageError, match="UTF-8"):
        encode_ingest([BucketMessage("m1", "orders", b"\xff", DUE)])
    with pytest.raises(InvalidMessageError, match="empty"):
        encode_ingest([BucketMessage("m1", "orders", b"", DUE)])
    with pytest.raises(InvalidMessageError, match="1 to 500"):
        encode_ingest([])


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"i": "has space"}, "invalid message id"),
        ({"i": "x" * 129}, "invalid message id"),
        ({"i": 7}, "invalid message id"),
        ({"q": "orders.fifo"}, "not a standard SQS queue name"),
        ({"q": "bad/name"}, "not a standard SQS queue name"),
        ({"q": ["orders"]}, "not a standard SQS queue name"),
        ({"b": ""}, "empty body"),
        ({"b": "\ud800"}, "SQS refuses"),
        ({"b": "a\x00"}, "SQS refuses"),
        ({"d": -1}, "due time"),
        ({"d": 1.5}, "due time"),
        ({"d": True}, "due time"),
        ({"d": 10**19}, "due time"),
        ({"s": "yesterday"}, "send time"),
        ({"a": {"DelayedDelivery.Ingest": ["String", "s", "1"]}}, "reserved"),
        ({"a": {"delayeddelivery.envelope": ["String", "s", "1"]}}, "reserved"),
        ({"a": {"AWS.x": ["String", "s", "1"]}}, "reserved"),
        ({"a": {"k": ["String", "s", "\ud800"]}}, "SQS refuses"),
        ({"a": {"k": ["Binary", "b", "not base64!"]}}, "base64"),
        ({"a": {"k": ["String", "x", "v"]}}, "unknown kind"),
        ({"a": {f"k{n}": ["String", "s", "v"] for n in range(11)}}, "at most 10"),
        ({"a": [1]}, "attributes must be an object"),
        ({"z": 1}, "unknown fields"),
    ],
)
def test_a_bad_entry_is_a_bad_item_and_its_neighbours_are_read(change: dict[str, Any], reason: str) -> None:
    first, bad, last = decode_ingest(_envelope(GOOD, {**GOOD, "i": "m2", **change}, {**GOOD, "i": "m3"}))
    assert isinstance(first, BucketMessage) and isinstance(last, BucketMessage)
    assert isinstance(bad, BadItem) and reason in bad.reason and "entry 1" in bad.reason
    assert NOT_SQS_TEXT.search(bad.body) is None  # the error queue takes it
    assert bad.message_id == ("m2" if "i" not in change else "ingest-item-1")


def test_a_bad_item_keeps_the_id_body_and_destination_it_could_read() -> None:
    _, bad = decode_ingest(_envelope(GOOD, {**GOOD, "i": "m2", "d": "soon"}))
    assert bad == BadItem("m2", "hi", bad.reason, "orders")  # type: ignore[union-attr]
    _, nameless = decode_ingest(_envelope(GOOD, {**GOOD, "i": None, "q": 5, "b": "\ud800"}))
    assert isinstance(nameless, BadItem) and nameless.destination is None
    assert nameless.message_id == "ingest-item-1" and "\\ud800" in nameless.body


def test_huge_numbers_spoil_their_entry_only() -> None:
    digits = "9" * 5_000
    entries = [f'{{"i":"m1","q":"o","b":"x","d":{digits}}}', f'{{"i":"m2","q":"o","b":"x","d":-{digits}}}']
    text = '{"v":1,"m":[' + ",".join(entries) + "]}"
    first, second = decode_ingest(text)
    assert isinstance(first, BadItem) and "5000-character number" in first.reason
    assert isinstance(second, BadItem) and "due time" in second.reason
    [third] = decode_ingest(_envelope(GOOD).replace(f'"d": {DUE}', '"d": Infinity'))
    assert isinstance(third, BadItem) and "Infinity" in third.reason
    [fourth] = decode_ingest(_envelope(GOOD).replace(f'"d": {DUE}', '"d": 1e400'))
    assert isinstance(fourth, BadItem)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("", "not JSON"),
        ("{", "not JSON"),
        ("[]", "version 1"),
        ('{"v":2,"m":[]}', "version 1"),
        ('{"v":1,"m":[]}', "no messages"),
        ('{"v":1}', "no messages"),
        ('{"v":1,"m":' + "[" * 17 + "]" * 17 + "}", "nested"),
        (json.dumps({"v": 1, "m": [GOOD] * (MAX_INGEST_ENTRIES + 1)}), "more than 500"),
        ("x" * 1_048_577, "more than"),
        ('{"v":1,"m":[{"i":"m1","q":"o","b":"\\ud800","d":1}]', "not JSON"),
    ],
)
def test_an_unreadable_envelope_is_one_bad_item_holding_the_body(body: str, reason: str) -> None:
    bad = _bad(body)
    assert bad.message_id == "ingest-envelope" and reason in bad.reason and bad.body == body


def test_an_envelope_inside_an_envelope_is_read_as_a_body_not_unpacked() -> None:
    inner = encode_ingest([BucketMessage("inner", "orders", b"x", DUE)])
    [outer] = decode_ingest(_envelope({**GOOD, "b": inner}))
    assert isinstance(outer, BucketMessage) and outer.body == inner.encode() and outer.message_id == "m1"


def test_a_non_text_body_is_a_bad_item() -> None:
    assert "not bytes" in _bad(b"{}").reason  # type: ignore[arg-type]


def test_pack_fills_envelopes_up_to_the_size_in_id_order() -> None:
    batch = [BucketMessage(f"m{n:03}", "orders", b"x" * 1_000, DUE + n) for n in reversed(range(200))]
    envelopes = pack_ingest(batch, 65_536)
    assert [m.message_id for e in envelopes for m in e] == sorted(m.message_id for m in batch)
    assert len(envelopes) == 4
    for envelope in envelopes:
        assert message_size(encode_ingest(envelope), ingest_attributes()) <= 65_536
        assert decode_ingest(encode_ingest(envelope)) == envelope
    big = BucketMessage("big", "orders", b"y" * 70_000, DUE)
    assert pack_ingest([big, *batch[:2]], 65_536)[0] == [big]
    assert ingest_entry_bytes(big) > 70_000


def test_pack_stops_at_500_entries() -> None:
    batch = [BucketMessage(f"m{n:04}", "o", b"x", DUE) for n in range(1_001)]
    assert [len(e) for e in pack_ingest(batch, 1_048_576)] == [500, 500, 1]
