"""Property-based fuzzing of what callers hand the senders: the core model, the SQS sender (moto server) and
the Azure sender (Azurite).

Inputs: delays (negative, NaN, infinities, huge, sub-second, duration strings good and bad, wrong types),
datetimes (naive, aware in any time zone, the first and last ones), bodies (empty, not text, not bytes, text SQS
refuses, exactly the size limit and one byte over), headers and attributes (unicode, empty, oversized, too many,
reserved prefixes, wrong types) and names (invalid, uppercase, too long, URLs, ``../x``, missing queues).

The property, for every call: either it succeeds and the message is exactly where it should be (read back from
the emulator: body, headers or attributes, due time or delay), or it raises a ``DelayedDeliveryError`` with a
message and nothing was sent. Any other exception fails the test. A batch either raises and sends nothing
(both senders validate everything first) or accounts for every message: accepted ones where they should be,
refused ones (SQS ``failures``) nowhere.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import pytest
from azure.storage.queue import QueueServiceClient
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from delayed_delivery import DelayedMessage, ManualClock
from delayed_delivery.aws.fifo_ids import deduplication_id
from delayed_delivery.aws.packing import (
    DEFAULT_PACK_BYTES,
    ENVELOPE_ATTRIBUTE,
    MAX_ENVELOPE_ENTRIES,
    MAX_HOP,
    MAX_REMAINING_MS,
    BadItem,
    PackedMessage,
    content_fingerprint,
    decode_envelope,
)
from delayed_delivery.aws.sender import DelayedSend, SendReceipt, SqsDelayedSender
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.aws.sqs import message_size, sqs_text_problem
from delayed_delivery.azure.sender import AzureDelayedSender, DelayRequest, SendResult
from delayed_delivery.azure.storage_queue import MAX_QUEUE_MESSAGE_BYTES, StorageQueueTransport, encode_envelope
from delayed_delivery.azure.storage_queue import decode_envelope as decode_azure
from delayed_delivery.azure.table_store import TableDelayedMessageStore
from delayed_delivery.delivery import DELIVERY_HEADER, longest_delivery
from delayed_delivery.durations import MAX_DELAY, parse_duration, to_seconds
from delayed_delivery.errors import DelayedDeliveryError, InvalidMessageError
from delayed_delivery.headers import DELAY_SECONDS_ATTRIBUTE, is_reserved
from delayed_delivery.jsonbounds import parse_headers_json
from delayed_delivery.planning import SqsRoute, whole_seconds
from delayed_delivery.settings import DelayedDeliverySettings
from tests.azure.conftest import make_store, new_name
from tests.fixtures.azurite import Azurite

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

#: Examples per run; the soak sets RELIABILITY_FUZZ_EXAMPLES higher.
EXAMPLES = int(os.environ.get("RELIABILITY_FUZZ_EXAMPLES", "60"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
SOME = settings(FUZZ, max_examples=max(1, EXAMPLES // 2))
#: Longest native delay in these tests (SQS and Azure): longer delays take the FIFO queue or the table, which
#: can be read back at once, and a native one is visible within a second.
CAP = 1
#: Slack for clocks: the emulators stamp times in milliseconds.
SLACK = timedelta(milliseconds=50)


@dataclass(frozen=True, slots=True)
class Sized:
    """A body sized to the destination's limit plus ``over`` bytes (-1, 0 or 1), built once the limit is known."""

    over: int
    fill: str = "x"


class _Valid:
    """Stands for the example's own (existing, valid) queue name."""

    def __repr__(self) -> str:
        return "VALID"


class _Missing:
    """Stands for a valid queue name that no queue has."""

    def __repr__(self) -> str:
        return "MISSING"


VALID, MISSING = _Valid(), _Missing()

# -- strategies shared by every sender ------------------------------------------------------------------------------


def mostly(valid: st.SearchStrategy[Any], odd: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``valid`` three times in four, else ``odd`` (so that most examples get far enough to be sent)."""
    return st.sampled_from([True, True, True, False]).flatmap(lambda ok: valid if ok else odd)


#: Valid delays at the edges: zero, sub-second, the native cap, the 100-year maximum, and readable strings.
EDGE_DELAYS: list[Any] = [0, -0.0, 0.001, 0.5, 1, 1.0000001, 2, 3600, 36_525 * 86_400, "2h", "90", "0.5", "1.5h"]
EDGE_DELAYS += ["2h30m", "500ms", "0.5ms", "40d", "1y", " 1 h 3 m ", "2H", "1d 2h 30m", timedelta(days=3)]
#: Delays no sender takes: negative, NaN, infinite, past 100 years, unreadable strings, wrong types.
ODD_DELAYS: list[Any] = [-1, -0.001, 36_525 * 86_400 + 1, 1e300, -1e300, math.nan, math.inf, -math.inf, 10**400]
ODD_DELAYS += [-(10**400), "-5m", "", " ", "200y", "nan", "inf", "1e400", "5x", "h", "1h-2m", "\x00", "9" * 400 + "s"]
ODD_DELAYS += ["١٢", "１２", "1_000", "1d 1d 1d", "1h 2d", "1e3", "1 000", "-inf", "NaN", "infinity"]
ODD_DELAYS += [None, True, [1], {"s": 1}, b"10", Decimal("1.5"), object(), timedelta(days=-1), timedelta.max]
delays = mostly(
    st.one_of(
        st.floats(min_value=0, max_value=CAP),  # native: sub-second included
        st.floats(min_value=0, max_value=10**8),
        st.integers(min_value=0, max_value=10**9),
        st.sampled_from(EDGE_DELAYS),
        st.from_regex(r"\A[0-9]{1,6}(\.[0-9]{1,3})?(ms|[wdhmsy])?\Z"),
        st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=400)),
    ),
    st.one_of(
        st.sampled_from(ODD_DELAYS),
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(max_value=-1),
        st.timedeltas(),
        st.from_regex(r"\A-\d{1,6}(ms|[wdhmsy])?\Z"),
        st.text(max_size=12),
    ),
)
zones = st.one_of(
    st.just(UTC),
    st.integers(min_value=-1439, max_value=1439).map(lambda m: timezone(timedelta(minutes=m))),
    st.timezones(),
)
moments = mostly(
    st.one_of(
        st.datetimes(min_value=datetime(2026, 1, 1), max_value=datetime(2036, 1, 1), timezones=zones),
        st.datetimes(timezones=zones),  # any year from 1 to 9999 (some leave the range once in UTC)
        st.sampled_from([datetime.max.replace(tzinfo=UTC), datetime.min.replace(tzinfo=UTC)]),
    ),
    st.one_of(
        st.datetimes(),  # naive
        st.sampled_from(
            [
                datetime.max.replace(tzinfo=timezone(timedelta(hours=-5))),
                datetime.min.replace(tzinfo=timezone(timedelta(hours=5))),
            ]
        ),
        st.sampled_from(["2030-01-01T00:00:00Z", 1.5e9, None, time.time]),
    ),
)
#: Text with what SQS refuses: NUL, U+FFFE, U+FFFF, and lone surrogates (which hypothesis never generates).
odd_text = st.sampled_from(["\ud800", "a\udfff", "\x00", "\uffff", "\ufffe", "ok\x7f", "\x1b[0m", "\u200b", "😀"])
message_ids = mostly(
    st.one_of(st.none(), st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=128)),
    st.sampled_from(["", " ", "has space", "x" * 129, "é", "id\x00", "id\ud800", 5, b"id"]),
)


def _attribute_value(value: Any) -> dict[str, Any]:
    """What SQS hands back for an attribute the caller gave as ``value`` (the sender's documented mapping)."""
    if isinstance(value, str):
        return {"DataType": "String", "StringValue": value}
    if isinstance(value, bytes):
        return {"DataType": "Binary", "BinaryValue": value}
    if isinstance(value, float):
        return {"DataType": "Number", "StringValue": repr(value)}
    if isinstance(value, int):
        return {"DataType": "Number", "StringValue": str(value)}
    return {k: bytes(v) if k == "BinaryValue" else v for k, v in dict(value).items()}


def _received(attributes: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Attributes as received, without the empty list fields boto3 adds nor the delivery header for consumers."""
    return {
        name: {k: v for k, v in value.items() if k in ("DataType", "StringValue", "BinaryValue")}
        for name, value in attributes.items()
        if name != DELIVERY_HEADER
    }


# -- the core model ---------------------------------------------------------------------------------------------------


@FUZZ
@given(
    delay=delays,
    at=moments,
    which=mostly(st.sampled_from(["delay", "at"]), st.sampled_from(["both", "neither"])),
    destination=mostly(
        st.from_regex(r"\A[A-Za-z0-9_.-]{1,20}\Z"),
        st.one_of(odd_text, st.text(min_size=1, max_size=20), st.sampled_from(["", " ", None, 5, b"q", "a" * 81])),
    ),
    body=mostly(st.binary(max_size=20), st.sampled_from(["text", "", None, 5, bytearray(b"ba"), memoryview(b"m")])),
    headers=mostly(
        st.one_of(st.none(), st.dictionaries(st.text(min_size=1, max_size=8), st.text(max_size=8), max_size=4)),
        st.one_of(
            st.dictionaries(odd_text, odd_text, min_size=1, max_size=2),
            st.sampled_from([{"a": 1}, {1: "a"}, {"a": None}, {"": "x"}, "k=v", [("a", "b")]]),
        ),
    ),
    message_id=message_ids,
)
def test_create_builds_exactly_what_it_was_asked_for_or_raises_a_clear_error(
    delay: Any, at: Any, which: str, destination: Any, body: Any, headers: Any, message_id: Any
) -> None:
    clock = ManualClock(datetime(2030, 1, 1, tzinfo=UTC))
    timing = {"delay": {"delay": delay}, "at": {"at": at}, "both": {"delay": delay, "at": at}, "neither": {}}[which]
    try:
        message = DelayedMessage.create(
            destination, body, headers=headers, message_id=message_id, clock=clock, **timing
        )
    except DelayedDeliveryError as exc:
        event(f"refused: {type(exc).__name__}")
        assert str(exc), repr(exc)
        return
    event("built")
    given_ = [k for k, v in timing.items() if v is not None]
    assert len(given_) == 1, timing  # exactly one of delay= and at=
    if given_ == ["delay"]:
        assert message.due_at == clock.now() + timedelta(seconds=to_seconds(delay))
    else:
        # astimezone: a local time in a DST gap compares unequal to every other datetime (PEP 495)
        assert message.due_at == at.astimezone(UTC) and message.due_at.utcoffset() == timedelta(0)
    assert (message.destination, message.body, dict(message.headers)) == (destination, bytes(body), dict(headers or {}))
    if message_id is None:
        assert uuid.UUID(message.message_id).version == 4
    else:
        assert message.message_id == message_id


@FUZZ
@given(
    message_id=mostly(
        st.text(st.characters(min_codepoint=0x21), min_size=1, max_size=128),
        st.sampled_from(["", " ", "x" * 129, "id\ud800", None, 5, b"id"]),
    ),
    destination=mostly(st.just("orders"), st.one_of(odd_text, st.sampled_from(["", "  ", None, 5]))),
    body=mostly(st.binary(max_size=8), st.sampled_from(["text", None, 5, bytearray(b"x"), memoryview(b"y")])),
    due_at=moments,
    headers=mostly(
        st.dictionaries(st.text(min_size=1, max_size=4), st.text(max_size=4), max_size=3),
        st.sampled_from([None, {"": "x"}, {"a": 1}, {"a\ud800": "b"}]),
    ),
    failure_count=mostly(
        st.integers(min_value=0, max_value=2**70),
        st.one_of(st.integers(max_value=-1), st.sampled_from([True, 1.0, None, "1"])),
    ),
)
def test_the_constructor_keeps_what_it_was_given_or_raises_a_clear_error(
    message_id: Any, destination: Any, body: Any, due_at: Any, headers: Any, failure_count: Any
) -> None:
    try:
        message = DelayedMessage(message_id, destination, body, due_at, headers, failure_count)
    except DelayedDeliveryError as exc:
        event(f"refused: {type(exc).__name__}")
        assert str(exc), repr(exc)
        return
    assert (message.message_id, message.destination, message.body) == (message_id, destination, bytes(body))
    event("built")
    assert message.due_at == due_at.astimezone(UTC) and message.due_at.utcoffset() == timedelta(0)
    assert dict(message.headers) == headers and message.failure_count == failure_count


# -- SQS (moto server) ----------------------------------------------------------------------------------------------

sqs_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xD7FF), min_size=1, max_size=30)
sqs_bodies = mostly(
    st.one_of(sqs_text, st.sampled_from([Sized(0), Sized(-1), Sized(0, "é"), Sized(-1, "€")])),
    st.one_of(st.text(max_size=30), odd_text, st.sampled_from([Sized(1), Sized(1, "€"), "", b"bytes", None, 5])),
)
sqs_values = st.one_of(
    sqs_text,
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=False, allow_infinity=False),
    st.binary(min_size=1, max_size=8),
    st.fixed_dictionaries(
        {"DataType": st.sampled_from(["String", "Number", "String.custom"]), "StringValue": sqs_text}
    ),
    st.fixed_dictionaries({"DataType": st.just("Binary.custom"), "BinaryValue": st.binary(min_size=1, max_size=8)}),
)
sqs_names = st.sampled_from(["kind", "tenant", "x.y", "a-b_c", "Upper", "n" * 256])
odd_attribute_names = st.one_of(
    st.sampled_from(["", "DelayedDelivery.Other", DELAY_SECONDS_ATTRIBUTE, "AWS.trace", "amazon.x", "a..b", ".a"]),
    st.sampled_from(["é", "with space", "n" * 257]),
    st.text(max_size=6),
)
odd_attribute_values = st.one_of(
    st.text(max_size=10),
    odd_text,
    st.floats(),
    st.sampled_from([True, None, b"", "", 10**400, "x" * 300_000, [1], {"DataType": "Bogus", "StringValue": "v"}]),
    st.fixed_dictionaries(
        {"DataType": st.sampled_from(["String", "Number", "Binary", "", "String.\ud800"])},
        optional={"StringValue": st.one_of(st.text(max_size=5), st.integers()), "BinaryValue": st.binary(max_size=4)},
    ),
)
sqs_attributes = mostly(
    st.one_of(st.none(), st.dictionaries(sqs_names, sqs_values, max_size=3), st.just({f"a{i}": "v" for i in range(9)})),
    st.one_of(
        st.dictionaries(
            st.one_of(sqs_names, odd_attribute_names), st.one_of(sqs_values, odd_attribute_values), max_size=4
        ),
        st.integers(min_value=10, max_value=11).map(lambda n: {f"a{i}": "v" for i in range(n)}),  # 10 fit natively
        st.sampled_from(["not a mapping", [("a", "b")]]),
    ),
)
sqs_destinations = mostly(
    st.just(VALID),
    st.one_of(
        st.just(MISSING),
        st.sampled_from(["UPPER", "../x", "https://sqs.us-east-1.amazonaws.com/123456789012/q", "q" * 81, "q" * 70]),
        st.sampled_from(["x.fifo", "", " ", "a b", "é", None, 5]),
    ),
)
limits = st.sampled_from([1024, 262_144, 1_048_576])


@dataclass(frozen=True, slots=True)
class SqsQueues:
    """One example's destination and its ``-delay.fifo`` queue (queue-level delay 0, so it reads back at once)."""

    name: str
    url: str
    delay_url: str
    limit: int


def _sqs_queues(sqs: SQSClient, limit: int) -> SqsQueues:
    """Fresh queues for one example (moto is O(depth), and FIFO deduplication must not see other examples)."""
    name = f"fz{uuid.uuid4().hex[:12]}"
    size: dict[Any, str] = {"MaximumMessageSize": str(limit)}
    url = sqs.create_queue(QueueName=name, Attributes=size)["QueueUrl"]
    delay_url = sqs.create_queue(
        QueueName=f"{name}-delay.fifo", Attributes={**size, "FifoQueue": "true", "DelaySeconds": "0"}
    )["QueueUrl"]
    return SqsQueues(name, url, delay_url, limit)


def _sqs_name(value: Any, queues: SqsQueues) -> Any:
    """The example's queue name for the VALID/MISSING/UPPER stand-ins."""
    if value is VALID:
        return queues.name
    if value is MISSING:
        return f"missing{uuid.uuid4().hex[:8]}"
    return queues.name.upper() if value == "UPPER" else value


def _sqs_body(value: Any, queues: SqsQueues, delay: Any, attributes: Any, message_id: Any = None) -> Any:
    """A ``Sized`` body made to the byte: the limit the message meets on its route, plus ``over``.

    The sender keeps room for the longest delivery header of the id on every route (#23); without an id it makes a
    UUID, 36 characters.
    """
    if not isinstance(value, Sized):
        return value
    counted: dict[str, Any] = {}
    if isinstance(attributes, Mapping):
        try:
            counted = {str(k): _attribute_value(v) for k, v in attributes.items()}
        except (TypeError, ValueError):
            counted = {}
    usable = isinstance(message_id, str) and re.fullmatch(r"[\x21-\x7e]{1,128}", message_id)
    key = message_id if usable else str(uuid.uuid4())  # an unusable id is refused before the size matters
    counted[DELIVERY_HEADER] = {"DataType": "String", "StringValue": longest_delivery(key)}
    try:
        room = queues.limit + value.over - message_size("", counted)
    except (TypeError, KeyError, ValueError, UnicodeEncodeError):
        room = queues.limit + value.over
    width = len(value.fill.encode("utf-8"))
    return value.fill * (room // width) + "x" * (room % width)


def _drain_sqs(sqs: SQSClient, url: str, *, expect: int = 0, wait: float = 0.0) -> list[dict[str, Any]]:
    """Receive and delete everything on ``url``; keep polling up to ``wait`` s while fewer than ``expect`` came."""
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + wait
    while True:
        reply = sqs.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=1 if len(out) < expect and time.monotonic() < deadline else 0,
            MessageAttributeNames=["All"],
            MessageSystemAttributeNames=["MessageGroupId", "MessageDeduplicationId", "SentTimestamp"],
        )
        messages: list[dict[str, Any]] = [{**m, "_received": time.time()} for m in reply.get("Messages", [])]
        for m in messages:
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
        out.extend(messages)
        if not messages and (len(out) >= expect or time.monotonic() >= deadline):
            return out


def _sqs_depth(sqs: SQSClient, url: str) -> int:
    """Visible + in flight + delayed messages."""
    names: Any = [
        "ApproximateNumberOfMessages",
        "ApproximateNumberOfMessagesNotVisible",
        "ApproximateNumberOfMessagesDelayed",
    ]
    return sum(int(v) for v in sqs.get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"].values())


def _sqs_sender(sqs: SQSClient) -> SqsDelayedSender:
    """A sender with the native cap compressed to ``CAP``."""
    return _sqs_packing_sender(sqs, DEFAULT_PACK_BYTES)


def _sqs_packing_sender(sqs: SQSClient, pack_bytes: int) -> SqsDelayedSender:
    """A sender with the native cap compressed to ``CAP`` and envelopes of ``pack_bytes``."""
    sqs_settings = SqsSettings(
        max_native_delay=CAP, fifo_queue_delay=CAP, pack_bytes=pack_bytes, long_delay_route="fifo"
    )
    return SqsDelayedSender(sqs, DelayedDeliverySettings(error_queue="errors"), sqs_settings=sqs_settings)


def _check_sqs_native(
    message: dict[str, Any], body: str, attributes: Any, receipt: SendReceipt, sent_at: float
) -> None:
    """A native message carries the body and attributes as given and did not arrive before its delay."""
    assert message["Body"] == body
    assert _received(message.get("MessageAttributes", {})) == {
        k: _attribute_value(v) for k, v in (attributes or {}).items()
    }
    assert message["_received"] >= sent_at + receipt.delay_seconds - SLACK.total_seconds(), (receipt, sent_at)


def _user_attributes(message: dict[str, Any]) -> dict[str, Any]:
    """A received message's attributes without the delay control attribute (what the fingerprint covers)."""
    return {k: v for k, v in message.get("MessageAttributes", {}).items() if k != DELAY_SECONDS_ATTRIBUTE}


def _check_sqs_fifo(message: dict[str, Any], body: str, attributes: Any, receipt: SendReceipt) -> None:
    """A long delay travels alone on ``-delay.fifo`` with its delay attribute, group id and hop-0 deduplication id."""
    control = {DELAY_SECONDS_ATTRIBUTE: {"DataType": "Number", "StringValue": str(receipt.delay_seconds)}}
    expected = {**{k: _attribute_value(v) for k, v in (attributes or {}).items()}, **control}
    assert message["Body"] == body
    assert _received(message.get("MessageAttributes", {})) == expected
    assert message["Attributes"]["MessageGroupId"] == receipt.message_id
    fp = content_fingerprint(body, _user_attributes(message))
    assert message["Attributes"]["MessageDeduplicationId"] == deduplication_id(receipt.message_id, 0, fp)


@pytest.mark.moto
@FUZZ
@given(
    destination=sqs_destinations,
    body=sqs_bodies,
    delay=delays,
    attributes=sqs_attributes,
    message_id=message_ids,
    limit=limits,
)
def test_sqs_send_delivers_exactly_what_was_asked_or_raises_a_clear_error_and_sends_nothing(
    sqs: SQSClient, destination: Any, body: Any, delay: Any, attributes: Any, message_id: Any, limit: int
) -> None:
    queues = _sqs_queues(sqs, limit)
    destination = _sqs_name(destination, queues)
    body = _sqs_body(body, queues, delay, attributes, message_id)
    sent_at = time.time()
    try:
        receipt = _sqs_sender(sqs).send_delayed(destination, body, delay, attributes=attributes, message_id=message_id)
    except DelayedDeliveryError as exc:
        event(f"refused: {type(exc).__name__}")
        assert str(exc), repr(exc)
        assert _sqs_depth(sqs, queues.url) == 0 and _sqs_depth(sqs, queues.delay_url) == 0, "refused, yet sent"
        return
    event(f"sent: {receipt.route}")
    assert destination == queues.name and receipt.destination == destination
    assert receipt.delay_seconds == whole_seconds(delay)
    assert message_id is None or receipt.message_id == message_id
    native = _drain_sqs(sqs, queues.url, expect=int(receipt.route is SqsRoute.NATIVE), wait=CAP + 2)
    fifo = _drain_sqs(sqs, queues.delay_url)
    if receipt.route is SqsRoute.NATIVE:
        assert receipt.delay_seconds <= CAP and fifo == [] and len(native) == 1, (native, fifo)
        _check_sqs_native(native[0], body, attributes, receipt, sent_at)
    else:
        assert receipt.delay_seconds > CAP and native == [] and len(fifo) == 1, (native, fifo)
        _check_sqs_fifo(fifo[0], body, attributes, receipt)


good_sends = st.builds(
    lambda body, delay, attributes: (VALID, body, delay, attributes),
    sqs_text,
    st.sampled_from([0, 0.4, 1, 2, "40d", 3600, "2h", timedelta(days=2)]),  # mostly long: packed together
    st.dictionaries(st.sampled_from(["kind", "tenant"]), sqs_values, max_size=2),
)
fuzzed_sends = st.tuples(sqs_destinations, sqs_bodies, delays, sqs_attributes)


@pytest.mark.moto
@SOME
@given(
    sends=st.lists(mostly(good_sends, fuzzed_sends), min_size=2, max_size=6),
    duplicate=mostly(st.just(False), st.just(True)),
    pack=st.sampled_from([0, 65_536]),
)
def test_sqs_batch_sends_every_accepted_message_where_it_belongs_or_nothing_at_all(
    sqs: SQSClient, sends: list[tuple[Any, Any, Any, Any]], duplicate: bool, pack: int
) -> None:
    queues = _sqs_queues(sqs, 262_144)
    ids = [f"m{i}-{uuid.uuid4().hex[:6]}" for i in range(len(sends))]
    if duplicate and len(ids) > 1:
        ids[-1] = ids[0]
    batch = [
        DelayedSend(_sqs_name(d, queues), _sqs_body(b, queues, delay, a, ids[i]), delay, a, ids[i])
        for i, (d, b, delay, a) in enumerate(sends)
    ]
    sender = _sqs_packing_sender(sqs, pack)
    try:
        result = sender.send_delayed_batch(batch)
    except DelayedDeliveryError as exc:
        event(f"refused: {type(exc).__name__}")
        assert str(exc), repr(exc)
        assert _sqs_depth(sqs, queues.url) == 0 and _sqs_depth(sqs, queues.delay_url) == 0, "refused, yet sent"
        return
    event(f"sent: {len(result.receipts)} of {len(batch)}")
    accepted = {r.message_id: r for r in result.receipts}
    assert sorted([*accepted, *result.failures]) == sorted(ids), "every message accepted or refused, once"
    assert all(str(e) for e in result.failures.values())
    by_id = {m.message_id: m for m in batch}
    natives = [r for r in result.receipts if r.route is SqsRoute.NATIVE]
    native = _drain_sqs(sqs, queues.url, expect=len(natives), wait=CAP + 2)
    expected = Counter((by_id[r.message_id].body, repr(_sorted_attrs(by_id[r.message_id].attributes))) for r in natives)
    got = Counter((m["Body"], repr(_sorted_attrs(_received(m.get("MessageAttributes", {}))))) for m in native)
    assert got == expected, "native messages: each accepted one once, nothing else"
    fifo = {r.message_id: r for r in result.receipts if r.route is SqsRoute.FIFO}
    arrived: dict[str, tuple[str, dict[str, Any], int]] = {}
    for m in _drain_sqs(sqs, queues.delay_url):
        if ENVELOPE_ATTRIBUTE in m.get("MessageAttributes", {}):
            event("packed in an envelope")
            for item in decode_envelope(m["Body"]):
                assert isinstance(item, PackedMessage) and item.hop == 0, item
                assert item.message_id not in arrived, "a message twice on the delay queue"
                assert fifo[item.message_id].envelope_id == m["Attributes"]["MessageDeduplicationId"]
                arrived[item.message_id] = (item.body, dict(item.attributes), item.remaining_ms // 1000)
        else:
            mid = m["Attributes"]["MessageGroupId"]
            assert mid not in arrived, "a message twice on the delay queue"
            attrs = _received(m["MessageAttributes"])
            seconds = int(attrs.pop(DELAY_SECONDS_ATTRIBUTE)["StringValue"])
            fp = content_fingerprint(m["Body"], _user_attributes(m))
            assert m["Attributes"]["MessageDeduplicationId"] == deduplication_id(mid, 0, fp)
            arrived[mid] = (m["Body"], attrs, seconds)
    assert set(arrived) == set(fifo), "long delays: each accepted one once on the delay queue, nothing else"
    for mid, (body, attrs, seconds) in arrived.items():
        sent = by_id[mid]
        assert (body, seconds) == (sent.body, fifo[mid].delay_seconds)
        assert _received(attrs) == {k: _attribute_value(v) for k, v in (sent.attributes or {}).items()}


def _sorted_attrs(attributes: Any) -> list[tuple[str, Any]]:
    """Attributes in the received shape, sorted, for comparing as a multiset."""
    shaped = _received({k: _attribute_value(v) for k, v in (attributes or {}).items()})
    return sorted((k, sorted(v.items())) for k, v in shaped.items())


# -- Azure Storage Queues and the delays table (Azurite) --------------------------------------------------------------

azure_destinations = mostly(
    st.just(VALID),
    st.one_of(
        st.just(MISSING),
        st.sampled_from(["UPPER", "../x", "https://acct.queue.core.windows.net/q", "ab", "a--b", "-ab", "x" * 64]),
        st.sampled_from(["", " ", "q_1", "é", None, 5]),
    ),
)
azure_bodies = mostly(
    st.one_of(st.binary(max_size=40), st.sampled_from([b"", b"\xff\xfe\x00", Sized(0), Sized(-1), bytearray(b"ba")])),
    st.sampled_from([Sized(1), "text", None, 5]),
)
azure_headers = mostly(
    st.one_of(
        st.none(),
        st.dictionaries(st.text(min_size=1, max_size=8), st.text(max_size=8), max_size=4),
        st.integers(min_value=1, max_value=2000).map(lambda n: {f"h{i}": "v" for i in range(n)}),  # many
    ),
    st.one_of(
        st.dictionaries(odd_text, odd_text, min_size=1, max_size=2),
        st.sampled_from([{"": "x"}, {"a": 1}, {1: "a"}, {"k": "v" * 70_000}, "k=v", [("a", "b")]]),
        st.integers(min_value=5000, max_value=6000).map(lambda n: {f"h{i}": "v" for i in range(n)}),  # too many
    ),
)
timings = mostly(
    st.one_of(delays.map(lambda d: {"delay": d}), moments.map(lambda t: {"at": t})),
    st.one_of(st.tuples(delays, moments).map(lambda p: {"delay": p[0], "at": p[1]}), st.just({})),
)


@dataclass
class AzureTarget:
    """The store and queue client of one test; a fresh queue per example."""

    store: TableDelayedMessageStore
    queues: QueueServiceClient
    connection_string: str


@pytest.fixture
def azure_target(azurite: Azurite) -> Iterator[AzureTarget]:
    """A store on a fresh table, dropped afterwards."""
    store = make_store(azurite.connection_string, new_name())
    yield AzureTarget(
        store, QueueServiceClient.from_connection_string(azurite.connection_string), azurite.connection_string
    )
    store.drop()


def _fresh_queue(target: AzureTarget) -> str:
    """A new queue for one example, and an empty table (whatever an earlier, failed example left)."""
    for entity in target.store.table.list_entities():
        target.store.table.delete_entity(entity["PartitionKey"], entity["RowKey"])
    queue = new_name("q")
    target.queues.create_queue(queue)
    return queue


def _azure_sender(target: AzureTarget) -> AzureDelayedSender:
    """A sender whose native route holds at most ``CAP`` seconds (longer: the table)."""
    transport = StorageQueueTransport.from_connection_string(target.connection_string)
    return AzureDelayedSender(transport, target.store, DelayedDeliverySettings(), max_native_delay=CAP)


def _azure_name(value: Any, queue: str) -> Any:
    """The example's queue name for the VALID/MISSING/UPPER stand-ins."""
    if value is VALID:
        return queue
    if value is MISSING:
        return new_name("m")
    return queue.upper() if value == "UPPER" else value


def _azure_body(value: Any, message_id: Any, headers: Any) -> Any:
    """A ``Sized`` body: the largest that fits a 64 KiB queue message with this id and these headers, plus ``over``."""
    if not isinstance(value, Sized):
        return value
    probe_id = message_id if isinstance(message_id, str) else str(uuid.uuid4())
    try:
        probe = DelayedMessage(probe_id, "probe", b"", datetime(2030, 1, 1, tzinfo=UTC), headers or {})
        room = MAX_QUEUE_MESSAGE_BYTES - len(encode_envelope(probe))
    except DelayedDeliveryError:
        room = MAX_QUEUE_MESSAGE_BYTES
    return b"x" * (max(0, room) // 4 * 3 + value.over)  # base64: 3 bytes become 4 characters


def _azure_messages(target: AzureTarget, queue: str, *, expect: int, wait: float) -> list[tuple[Any, float]]:
    """Every message on ``queue`` (decoded) with the time it was read; polls up to ``wait`` s for ``expect``."""
    client = target.queues.get_queue_client(queue)
    out: list[tuple[Any, float]] = []
    deadline = time.monotonic() + wait
    while True:
        batch = list(client.receive_messages(messages_per_page=32, max_messages=32, visibility_timeout=300))
        out.extend((decode_azure(m.content), time.time()) for m in batch)
        if (len(out) >= expect and not batch) or time.monotonic() >= deadline:
            return out
        if not batch:
            time.sleep(0.05)


def _nothing_written(target: AzureTarget, queue: str) -> bool:
    """No message on the queue (visible or not) and no row in the table."""
    props = target.queues.get_queue_client(queue).get_queue_properties()
    return props.approximate_message_count == 0 and target.store.count() == 0


def _expected_due(request: DelayRequest, before: datetime, after: datetime) -> tuple[datetime, datetime]:
    """Earliest and latest due time a request may have been given."""
    if request.at is not None:
        return request.at, request.at
    seconds = timedelta(seconds=to_seconds(request.delay))  # type: ignore[arg-type]
    return before + seconds, after + seconds


def _check_azure(
    target: AzureTarget,
    requests: list[DelayRequest],
    results: list[SendResult],
    before: datetime,
    after: datetime,
    queue: str,
) -> None:
    """Native sends on the queue (id, headers, body, not early), table sends in the table (and nothing else)."""
    assert len(results) == len(requests)
    natives = {r.message_id: (q, r) for q, r in zip(requests, results, strict=True) if r.route == "native"}
    tables = [(q, r) for q, r in zip(requests, results, strict=True) if r.route == "table"]
    for request, result in zip(requests, results, strict=True):
        lo, hi = _expected_due(request, before, after)
        assert lo - result.due_at <= SLACK and result.due_at - hi <= SLACK, (request, result)
        assert result.destination == request.destination
        if request.destination != queue:  # a missing queue: only a table row, checked when it is dispatched
            assert result.route == "table", result
        assert request.message_id is None or result.message_id == request.message_id
        if result.route == "native":
            assert not request.cancellable and result.due_at <= after + timedelta(seconds=CAP) + SLACK, result
    arrived = _azure_messages(target, queue, expect=len(natives), wait=CAP + 2 if natives else 0)
    assert sorted(e.message_id for e, _ in arrived) == sorted(natives), "each native message once, nothing else"
    for envelope, read_at in arrived:
        request, result = natives[envelope.message_id]
        headers = {k: v for k, v in envelope.headers.items() if k != DELIVERY_HEADER}  # ours, for the consumer
        assert (envelope.body, headers) == (bytes(request.body), dict(request.headers or {}))
        # Azurite keeps visibility to the second: allow one second, never more
        assert datetime.fromtimestamp(read_at, UTC) - result.due_at >= -(SLACK + timedelta(seconds=1)), "early"
    assert target.store.count() == len(tables)
    for request, result in tables:
        stored = target.store.get(result.message_id)
        assert stored is not None and stored.due_at == result.due_at
        assert (stored.destination, stored.body) == (request.destination, bytes(request.body))
        assert dict(stored.headers) == dict(request.headers or {})


@pytest.mark.azurite
@FUZZ
@given(
    destination=azure_destinations,
    body=azure_bodies,
    timing=timings,
    headers=azure_headers,
    message_id=message_ids,
    cancellable=st.booleans(),
)
def test_azure_send_delivers_exactly_what_was_asked_or_raises_a_clear_error_and_writes_nothing(
    azure_target: AzureTarget,
    destination: Any,
    body: Any,
    timing: dict[str, Any],
    headers: Any,
    message_id: Any,
    cancellable: bool,
) -> None:
    queue = _fresh_queue(azure_target)
    request = DelayRequest(
        _azure_name(destination, queue),
        _azure_body(body, message_id, headers),
        headers=headers,
        message_id=message_id,
        cancellable=cancellable,
        **timing,
    )
    before = datetime.now(UTC)
    try:
        results = _azure_sender(azure_target).send_many([request])
    except DelayedDeliveryError as exc:
        event(f"refused: {type(exc).__name__}")
        assert str(exc), repr(exc)
        assert _nothing_written(azure_target, queue), "refused, yet written"
        return
    event(f"sent: {results[0].route}")
    _check_azure(azure_target, [request], results, before, datetime.now(UTC), queue)


good_requests = st.builds(
    lambda body, timing, headers, cancellable: (VALID, body, timing, headers, cancellable),
    st.binary(max_size=20),
    st.sampled_from([{"delay": 0}, {"delay": 0.5}, {"delay": "9d"}, {"at": datetime(2031, 1, 1, tzinfo=UTC)}]),
    st.dictionaries(st.text(min_size=1, max_size=5), st.text(max_size=5), max_size=2),
    st.booleans(),
)
fuzzed_requests = st.tuples(
    azure_destinations.filter(lambda d: d is not MISSING), azure_bodies, timings, azure_headers, st.booleans()
)


@pytest.mark.azurite
@SOME
@given(
    requests=st.lists(mostly(good_requests, fuzzed_requests), min_size=2, max_size=5),
    duplicate=mostly(st.just(False), st.just(True)),
)
def test_azure_batch_sends_every_message_where_it_belongs_or_nothing_at_all(
    azure_target: AzureTarget, requests: list[tuple[Any, Any, Any, Any, bool]], duplicate: bool
) -> None:
    # A valid name of a missing queue is left out here: a native send to it fails at send time, after the table
    # rows and the other native sends of the batch went out (send_many validates names, not that queues exist).
    queue = _fresh_queue(azure_target)
    ids = [f"m{i}-{uuid.uuid4().hex[:6]}" for i in range(len(requests))]
    if duplicate and len(ids) > 1:
        ids[-1] = ids[0]
    batch = [
        DelayRequest(_azure_name(d, queue), _azure_body(b, ids[i], h), headers=h, message_id=ids[i], cancellable=c, **t)
        for i, (d, b, t, h, c) in enumerate(requests)
    ]
    before = datetime.now(UTC)
    try:
        results = _azure_sender(azure_target).send_many(batch)
    except DelayedDeliveryError as exc:
        event(f"refused: {type(exc).__name__}")
        assert str(exc), repr(exc)
        assert _nothing_written(azure_target, queue), "refused, yet written"
        return
    event(f"sent: {len(results)}")
    _check_azure(azure_target, batch, results, before, datetime.now(UTC), queue)


# -- the size limits, exactly -----------------------------------------------------------------------------------------


@pytest.mark.moto
@pytest.mark.parametrize("limit", [1024, 262_144])
@pytest.mark.parametrize("delay", [0, "40d"], ids=["native", "fifo"])
def test_sqs_message_of_exactly_the_queue_limit_is_sent_and_one_byte_more_is_refused(
    sqs: SQSClient, limit: int, delay: Any
) -> None:
    """The limit counts the longest delivery header of the id (#23: before, the header was dropped when it did not
    fit); on the FIFO route the destination's limit binds, the header being longer than the control attribute."""
    queues = _sqs_queues(sqs, limit)
    attributes = {"kind": "é"}
    fits = _sqs_body(Sized(0, "é"), queues, delay, attributes, "edge-1")
    sender = _sqs_sender(sqs)
    with pytest.raises(InvalidMessageError, match="accepts at most"):
        sender.send_delayed(queues.name, fits + "x", delay, attributes=attributes, message_id="edge-1")
    assert _sqs_depth(sqs, queues.url) == 0 and _sqs_depth(sqs, queues.delay_url) == 0
    receipt = sender.send_delayed(queues.name, fits, delay, attributes=attributes, message_id="edge-1")
    [message] = _drain_sqs(sqs, queues.url if receipt.route is SqsRoute.NATIVE else queues.delay_url, expect=1, wait=2)
    assert message["Body"] == fits
    reserved = {**attributes, DELIVERY_HEADER: longest_delivery("edge-1")}
    assert message_size(fits, {k: _attribute_value(v) for k, v in reserved.items()}) == limit
    assert message_size(fits, message["MessageAttributes"]) <= limit  # what travels: the header as written


@pytest.mark.azurite
@pytest.mark.parametrize("timing", [{"delay": 0}, {"delay": "9d"}], ids=["native", "table"])
def test_azure_message_of_exactly_the_queue_message_limit_is_sent_and_one_byte_more_is_refused(
    azure_target: AzureTarget, timing: dict[str, Any]
) -> None:
    queue = _fresh_queue(azure_target)
    headers = {"k": "v"}
    fits = _azure_body(Sized(0), "edge", headers)
    edge = DelayedMessage("edge", queue, fits, datetime(2030, 1, 1, tzinfo=UTC), headers)
    assert MAX_QUEUE_MESSAGE_BYTES - 4 < len(encode_envelope(edge)) <= MAX_QUEUE_MESSAGE_BYTES  # base64: steps of 4
    sender = _azure_sender(azure_target)
    with pytest.raises(InvalidMessageError, match="take at most 65536"):
        sender.send_many([DelayRequest(queue, fits + b"x", headers=headers, message_id="edge", **timing)])
    assert _nothing_written(azure_target, queue)
    request = DelayRequest(queue, fits, headers=headers, message_id="edge", **timing)
    before = datetime.now(UTC)
    _check_azure(azure_target, [request], sender.send_many([request]), before, datetime.now(UTC), queue)


# -- what arrives from outside: duration strings, envelopes and headers JSON ------------------------------------

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.sampled_from([10**400 // 10**300, MAX_REMAINING_MS, MAX_REMAINING_MS + 1, MAX_HOP + 1, -1, 0]),
    st.text(max_size=6),
    odd_text,
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=3), inner, max_size=3)),
)
attribute_entries = st.one_of(
    st.tuples(
        st.sampled_from(["String", "Number", "Binary", "String.\ud800"]),
        st.sampled_from(["s", "b", "x"]),
        st.one_of(st.text(max_size=6), odd_text),
    ).map(list),
    json_values,
)
entries = st.one_of(
    st.fixed_dictionaries(
        {
            "i": mostly(st.from_regex(r"\A[!-~]{1,10}\Z"), json_values),
            "h": mostly(st.integers(min_value=0, max_value=10**6), json_scalars),
            "d": mostly(st.integers(min_value=0, max_value=MAX_REMAINING_MS), json_scalars),
            "b": mostly(st.text(min_size=1, max_size=8), st.one_of(odd_text, json_scalars)),
        },
        optional={
            "a": st.dictionaries(
                mostly(
                    st.from_regex(r"\A[a-z]{1,4}\Z"),
                    st.sampled_from([ENVELOPE_ATTRIBUTE, "DelayedDelivery.x", "delayeddelivery.y", "AWS.z", "", "a b"]),
                ),
                attribute_entries,
                max_size=3,
            )
        },
    ),
    json_values,
)


@FUZZ
@given(items=st.lists(entries, min_size=0, max_size=4), version=mostly(st.just(1), json_values))
def test_an_envelope_decodes_into_bounded_entries_and_reasoned_bad_items_or_is_refused_whole(
    items: list[Any], version: Any
) -> None:
    body = json.dumps({"v": version, "m": items}, ensure_ascii=True)
    try:
        decoded = decode_envelope(body)
    except InvalidMessageError as exc:
        event("refused whole")
        assert "malformed envelope" in str(exc)
        return
    assert 1 <= len(decoded) <= MAX_ENVELOPE_ENTRIES
    for item in decoded:
        if isinstance(item, BadItem):
            event("bad item")
            assert item.reason and sqs_text_problem(item.body) is None, item  # the error queue can take it
            continue
        event("entry")
        assert 0 <= item.remaining_ms <= MAX_REMAINING_MS and 0 <= item.hop <= MAX_HOP
        assert sqs_text_problem(item.body) is None and not any(is_reserved(name) for name in item.attributes)
        for value in item.attributes.values():
            assert sqs_text_problem(str(value.get("StringValue", ""))) is None


@FUZZ
@given(
    text=st.one_of(
        st.text(max_size=16),
        st.from_regex(r"\A\s*([0-9]{1,4}(\.[0-9])?\s*(ms|[ywdhms])\s*){1,4}\Z"),
        st.sampled_from(ODD_DELAYS[9:22]),
    )
)
def test_a_duration_string_parses_within_the_bounds_or_raises_a_clear_error(text: Any) -> None:
    try:
        parsed = parse_duration(text)
    except InvalidMessageError as exc:
        event("refused")
        assert str(exc)
        return
    event("parsed")
    assert text.isascii() and "_" not in text
    assert timedelta(0) <= parsed <= MAX_DELAY


@FUZZ
@given(value=json_values, nesting=st.sampled_from([0, 0, 0, 2, 50, 5000]))
def test_headers_json_is_a_flat_string_object_or_a_clear_error(value: Any, nesting: int) -> None:
    text = "[" * nesting + json.dumps(value) + "]" * nesting
    try:
        headers = parse_headers_json(text)
    except InvalidMessageError as exc:
        event("refused")
        assert str(exc).startswith("headers")
        return
    event("parsed")
    assert isinstance(headers, dict) and all(isinstance(v, str) for v in headers.values())
