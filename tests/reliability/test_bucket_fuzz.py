"""Property-based fuzzing of hostile input to the S3 time-bucket tier (moto server, simulated time).

(a) Objects a careless or hostile producer puts straight under the tier's prefix: garbage bytes, gzip of junk, a
valid header with the wrong count, lines with huge ints, lone surrogates, NUL, reserved ``DelayedDelivery.*``
attribute names, JSON nested 1,000 deep, a destination that does not exist or is not a queue name, bodies too
large (70 KB for a 64 KiB queue; 1.5 MB), keys that look like ours but are not, keys outside the grammar.
(b) Ingest records into the ingest handler mixing the same (and whole records that are not envelopes).

Invariant: the ingest handler and ``BucketTimer.run`` return; every healthy message arrives exactly once and not
early; every bad one yields exactly one error-queue message with a reason (a key the tier cannot even name is set
aside under ``problems/`` instead); everything SQS is asked to send is text SQS takes. ``RELIABILITY_FUZZ_EXAMPLES``
sets the number of examples (40 by default, halved here: each example pays its own bucket, queues and 17 timer runs,
so it holds twice the hostile input an example used to, the same breadth over half the fixed cost).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from delayed_delivery.aws.sqs import sqs_text_problem
from delayed_delivery.aws.tier import timer as timer_module
from delayed_delivery.aws.tier.config import BucketTierConfig
from delayed_delivery.aws.tier.ingest_format import INGEST_ATTRIBUTE
from delayed_delivery.aws.tier.ingest_handler import build_ingest_handler
from delayed_delivery.aws.tier.store import S3BucketStore
from delayed_delivery.aws.tier.timer import BucketTimer, TimerResult
from delayed_delivery.clock import ManualClock
from delayed_delivery.delivery import DELIVERY_HEADER, decode_delivery, epoch_ms
from delayed_delivery.headers import FAILURE_REASON, is_reserved
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.testing.aws import LocalLambdaContext
from delayed_delivery.timebuckets.wheel import FINE, BucketLevel, bucket_of
from tests.fixtures.moto import REGION

pytestmark = pytest.mark.moto

EXAMPLES = int(os.environ.get("RELIABILITY_FUZZ_EXAMPLES", "40")) // 2
#: The destination's and the error queue's maximum message size in these tests (bytes).
SMALL_QUEUE = 65_536
PREFIX = "dd/buckets"
START = datetime(2031, 1, 1, tzinfo=UTC)
START_MS = epoch_ms(START)
#: Simulated seconds the timer runs for, one run every ``STEP`` (every due time is within the first 26 s).
RUN_SECONDS, STEP = 34, 2
#: No shrinking: each example runs the timer for a minute of simulated time on moto, so shrinking takes many minutes.
PHASES = (Phase.explicit, Phase.reuse, Phase.generate)


@pytest.fixture
def s3(moto_endpoint: str) -> Any:
    """A boto3 S3 client on the freshly reset moto server."""
    import boto3

    return boto3.client(
        "s3", endpoint_url=moto_endpoint, region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="x"
    )


@dataclass(frozen=True)
class Item:
    """One line of an object (or entry of an envelope): its raw text and what it becomes.

    ``kind``: ``ok`` (delivered, body ``delivers``), ``unreadable`` (one notice per object copy read, however many
    unreadable lines it holds), ``refused`` (a message the timer or the ingest refuses: one error-queue message
    however many copies).
    """

    text: str
    kind: str
    delivers: str | None = None


@dataclass
class Lab:
    """One example's world: its own bucket, queues and clock, and every send the timer made."""

    s3: Any
    sqs: Any
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:10])
    clock: ManualClock = field(default_factory=lambda: ManualClock(START))
    sends: list[tuple[datetime, dict[str, Any]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.bucket = f"fuzz-{self.tag}"
        self.s3.create_bucket(Bucket=self.bucket)
        self.orders, self.errors = f"o{self.tag}", f"e{self.tag}"
        self.urls = {}
        for name in (self.orders, self.errors):
            url = self.sqs.create_queue(QueueName=name, Attributes={"MaximumMessageSize": str(SMALL_QUEUE)})
            self.urls[name] = url["QueueUrl"]
        self.settings = DelayedDeliverySettings(error_queue=self.errors)
        self.levels = BucketLevel(fine_seconds=1, coarse_seconds=10, dispatch_lead_seconds=2)
        self.store = S3BucketStore(self.s3, self.bucket, PREFIX, self.levels)
        self.sqs.meta.events.register("provide-client-params.sqs.SendMessageBatch", self._record)

    def _record(self, params: dict[str, Any], **_: Any) -> None:
        """Keep every entry sent to the destination; send it without its delay (checked here, not waited for)."""
        if str(params["QueueUrl"]).endswith("/" + self.orders):
            for entry in params["Entries"]:
                self.sends.append((self.clock.now(), dict(entry)))
                entry["DelaySeconds"] = 0

    def run_timer(self) -> list[TimerResult]:
        timer = BucketTimer(self.store, self.sqs, self.settings, self.clock, owner="fuzz", lease_seconds=5)
        results = []
        for _ in range(RUN_SECONDS // STEP):
            self.clock.advance(STEP)
            results.append(timer.run())
        return results

    def drain(self, name: str) -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = []
        while True:
            reply = self.sqs.receive_message(
                QueueUrl=self.urls[name], MaxNumberOfMessages=10, WaitTimeSeconds=0, MessageAttributeNames=["All"]
            )
            messages = reply.get("Messages", [])
            if not messages:
                return got
            got.extend(messages)
            entries = [{"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(messages)]
            self.sqs.delete_message_batch(QueueUrl=self.urls[name], Entries=entries)

    def keys(self, under: str) -> list[str]:
        reply = self.s3.list_objects_v2(Bucket=self.bucket, Prefix=f"{PREFIX}/{under}")
        return [item["Key"] for item in reply.get("Contents", [])]

    def check(self, items: list[Item], expected_errors: int, results: list[TimerResult]) -> list[dict[str, Any]]:
        """The invariant; returns the error-queue messages."""
        assert sum(r.buckets_failed for r in results) == 0, results  # no bucket left failing
        assert self.keys("fine/") == [] and self.keys("coarse/") == []  # everything handled
        for at, entry in self.sends:  # what SQS would refuse never goes out
            assert sqs_text_problem(entry["MessageBody"]) is None, entry["MessageBody"][:200]
            for name, value in entry.get("MessageAttributes", {}).items():
                assert name == DELIVERY_HEADER or not is_reserved(name), name
                assert sqs_text_problem(value.get("StringValue", "")) is None, (name, value)
            info = decode_delivery(entry["MessageAttributes"][DELIVERY_HEADER]["StringValue"])
            assert info.due_ms is not None
            assert epoch_ms(at + timedelta(seconds=entry["DelaySeconds"])) >= info.due_ms  # not early
        delivered = sorted(m["Body"] for m in self.drain(self.orders))
        assert delivered == sorted(i.delivers for i in items if i.kind == "ok" and i.delivers)  # exactly once
        errors = self.drain(self.errors)
        reasons = [m["MessageAttributes"][FAILURE_REASON]["StringValue"] for m in errors]
        assert len(errors) == expected_errors, reasons
        assert all(reasons)
        return errors


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _line(message_id: str, destination: str, body: bytes, due_ms: int, **changes: Any) -> dict[str, Any]:
    line: dict[str, Any] = {
        "id": message_id,
        "destination": destination,
        "body": _b64(body),
        "attributes": {"kind": ["String", "s", "k"]},
        "due_at_ms": due_ms,
        "hops": 0,
        "sent_at_ms": START_MS,
    }
    line.update(changes)
    return line


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


#: Lines with the text the timer reads; ``{id}``, ``{dest}``, ``{due}`` filled in per line.
UNREADABLE_LINES = [
    "not json at all",
    "[]",
    "17",
    '{"id":"{id}"}',
    _nested(1_000),
    '{"id":"{id}","destination":"{dest}","body":"eA==","attributes":' + _nested(1_000) + ',"due_at_ms":{due},'
    '"hops":0,"sent_at_ms":1}',
    '{"id":"{id}","destination":"{dest}","body":"eA==","attributes":{},"due_at_ms":1' + "0" * 400 + ","
    '"hops":0,"sent_at_ms":1}',
    '{"id":"{id}","destination":"{dest}","body":"eA==","attributes":{},"due_at_ms":1' + "0" * 5_000 + ","
    '"hops":0,"sent_at_ms":1}',
    '{"id":"{id}","destination":"{dest}","body":"eA==","attributes":{},"due_at_ms":{due},"hops":1'
    + "0" * 300
    + ',"sent_at_ms":1}',
    '{"id":"\\ud800{id}","destination":"{dest}","body":"eA==","attributes":{},"due_at_ms":{due},"hops":0,'
    '"sent_at_ms":1}',
    '{"id":"{id}","destination":"not a queue!","body":"eA==","attributes":{},"due_at_ms":{due},"hops":0,'
    '"sent_at_ms":1}',
    '{"id":"{id}","destination":"{dest}","body":"!!","attributes":{},"due_at_ms":{due},"hops":0,"sent_at_ms":1}',
    '{"id":"{id}","destination":"{dest}","body":"eA==","attributes":{},"due_at_ms":-5,"hops":0,"sent_at_ms":1}',
    '{"id":"{id}",\x00"destination":"{dest}"}',
    '{"id":"{id}","destination":"{dest}","body":"eA==","attributes":{"kind":["String","s","a\\ud800b"]},'
    '"due_at_ms":{due},"hops":0,"sent_at_ms":1}',
    '{"id":"{id}","destination":"\ud800"}',  # a lone surrogate: written as bytes that are not UTF-8
]


def _refused_line(case: str, message_id: str, dest: str, due_ms: int) -> dict[str, Any]:
    """A line that reads as a message the timer must not send."""
    if case == "missing-queue":
        return _line(message_id, f"gone{dest}", b"x", due_ms)
    if case == "fifo":
        return _line(message_id, f"{dest}.fifo", b"x", due_ms)
    if case == "too-big":
        return _line(message_id, dest, b"y" * 70_000, due_ms)
    if case == "not-utf8":
        return _line(message_id, dest, b"\xff\xfe\x00", due_ms)
    if case == "nul-body":
        return _line(message_id, dest, b"a\x00b", due_ms)
    names = {"reserved": "DelayedDelivery.Delivery", "reserved2": "delayeddelivery.anything", "bad-name": "a b"}
    if case in names:
        return _line(message_id, dest, b"x", due_ms, attributes={names[case]: ["String", "s", "1"]})
    values = {"nul-attr": "a\x00b", "empty-attr": ""}
    if case in values:
        return _line(message_id, dest, b"x", due_ms, attributes={"kind": ["String", "s", values[case]]})
    assert case == "bad-type"
    return _line(message_id, dest, b"x", due_ms, attributes={"kind": ["Foo", "s", "1"]})


REFUSED_CASES = [
    "missing-queue",
    "fifo",
    "too-big",
    "not-utf8",
    "nul-body",
    "reserved",
    "reserved2",
    "bad-name",
    "nul-attr",
    "empty-attr",
    "bad-type",
]


@st.composite
def bucket_items(draw: st.DrawFn, lab_tag: str, first: int, due_ms: int) -> list[Item]:
    """One to five lines: healthy, unreadable or refused, all due within the same fine bucket."""
    items: list[Item] = []
    for n in range(draw(st.integers(1, 5))):
        message_id = f"m{lab_tag}-{first + n}"
        due = due_ms + n * 10
        kind = draw(st.sampled_from(["ok", "ok", "unreadable", "refused"]))
        if kind == "ok":
            body = f"body {message_id} " + draw(st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E)))
            items.append(Item(json.dumps(_line(message_id, f"o{lab_tag}", body.encode(), due)), "ok", body))
        elif kind == "unreadable":
            template = draw(st.sampled_from(UNREADABLE_LINES))
            text = template.replace("{id}", message_id).replace("{dest}", f"o{lab_tag}").replace("{due}", str(due))
            items.append(Item(text, "unreadable"))
        else:
            line = _refused_line(draw(st.sampled_from(REFUSED_CASES)), message_id, f"o{lab_tag}", due)
            items.append(Item(json.dumps(line, ensure_ascii=draw(st.booleans())), "refused"))
    return items


@dataclass(frozen=True)
class Put:
    """One object put under the prefix: a key and bytes, the items inside, the error messages it should yield."""

    key: str
    data: bytes
    items: tuple[Item, ...] = ()
    #: Error-queue messages this object yields on its own (notices), apart from its refused messages.
    notices: int = 0
    #: A key the tier cannot name: set aside under problems/, no error-queue message.
    stray: bool = False


def _hash() -> str:
    return hashlib.sha256(uuid.uuid4().bytes).hexdigest()


STRAY_NAMES = [
    "fine/2031-13-45T99:00:00Z/{hash}-1.jsonl.gz",
    "fine/{iso}/{short}-1.jsonl.gz",
    "fine/{iso}/{upper}-1.jsonl.gz",
    "fine/{iso}/{hash}-" + str(10**30) + ".jsonl.gz",
    "fine/{iso}/{hash}-0.jsonl.gz",
    "fine/{iso}/{hash}.json",
    "coarse/readme.txt",
    "coarse/{iso}",
    "fine/0000/x.jsonl.gz",
    "fine/0001-01-01T00:00:00Z/{hash}-1.jsonl.gz",
    "fine/{iso}/a b+c?d%20\u00e9#x&y=z.jsonl.gz",
    "coarse/{iso}/../{hash}-1.jsonl.gz",
]


@st.composite
def puts(draw: st.DrawFn, lab_tag: str) -> list[Put]:
    """Objects a hostile producer puts under the prefix (each in the bucket its own due time gives)."""
    out: list[Put] = []
    for n in range(draw(st.integers(2, 10))):  # two examples' worth of objects (1-5 each before)
        offset_ms = draw(st.integers(0, 24_000)) // 1_000 * 1_000 + 100
        due_ms = START_MS + offset_ms
        bucket = bucket_of(START + timedelta(milliseconds=offset_ms), START, BucketLevel(1, 10, 2))
        kind = draw(st.sampled_from(["lines", "lines", "lines", "wrong-count", "garbage", "gzip-junk", "stray"]))
        key = f"{PREFIX}/{bucket.level}/{bucket.iso}/{_hash()}-3.jsonl.gz"
        if kind == "garbage":
            out.append(Put(key, draw(st.sampled_from([b"", b"X"])) + draw(st.binary(max_size=200)), notices=1))
        elif kind == "gzip-junk":
            junk = draw(st.sampled_from([b"", b"\xff\x00junk", b"[[[[", b'{"v":2}', b'{"v":1,"count":10000000}']))
            out.append(Put(key, gzip.compress(junk + draw(st.binary(max_size=50))), notices=1))
        elif kind == "stray":
            name = draw(st.sampled_from(STRAY_NAMES))
            digest = _hash()
            name = name.replace("{hash}", digest).replace("{short}", digest[:63]).replace("{upper}", digest.upper())
            out.append(Put(f"{PREFIX}/{name.replace('{iso}', bucket.iso)}", b"whatever", stray=True))
        else:
            items = draw(bucket_items(lab_tag, 100 * n, due_ms))
            delta = draw(st.integers(1, 3)) if kind == "wrong-count" else 0
            header = json.dumps({"v": 1, "level": bucket.level, "bucket": bucket.iso, "count": len(items) + delta})
            raw = "\n".join([header, *(i.text for i in items), ""]).encode("utf-8", "surrogatepass")
            unreadable = sum(i.kind == "unreadable" for i in items)
            copies = 2 if draw(st.integers(0, 3)) == 0 else 1  # a second copy: read twice, delivered once
            for _ in range(copies):
                data = gzip.compress(raw, mtime=0)
                out.append(
                    Put(
                        f"{PREFIX}/{bucket.level}/{bucket.iso}/{_hash()}-3.jsonl.gz",
                        data,
                        tuple(items),
                        notices=1 if unreadable or delta else 0,  # one notice per bad object (#23)
                    )
                )
            if copies == 2:  # the items are counted once
                out[-1] = Put(out[-1].key, out[-1].data, (), out[-1].notices)
    return out


@settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture], phases=PHASES
)
@given(data=st.data())
def test_objects_put_by_a_hostile_producer_never_take_the_timer_or_their_neighbours_down(
    s3: Any, sqs: Any, data: st.DataObject
) -> None:
    lab = Lab(s3, sqs)
    put = data.draw(puts(lab.tag))
    huge = data.draw(st.booleans())  # as many 1.5 MB bodies over the run as at 1 in 4 over twice the examples
    if huge:  # a 1.5 MB body: its line is longer than any line the format writes
        line = json.dumps(_line(f"m{lab.tag}-huge", lab.orders, b"z" * 1_500_000, START_MS + 3_000))
        header = json.dumps({"v": 1, "level": FINE, "bucket": "2031-01-01T00:00:03Z", "count": 1})
        data_ = gzip.compress(f"{header}\n{line}\n".encode(), mtime=0)
        put.append(Put(f"{PREFIX}/fine/2031-01-01T00:00:03Z/{_hash()}-1.jsonl.gz", data_, (), notices=1))
    outside = f"{PREFIX}/elsewhere/{uuid.uuid4().hex}"  # under the prefix, outside the levels: left alone
    s3.put_object(Bucket=lab.bucket, Key=outside, Body=b"x")
    for p in put:
        s3.put_object(Bucket=lab.bucket, Key=p.key, Body=p.data)
    results = lab.run_timer()
    items = [i for p in put for i in p.items]
    expected = sum(p.notices for p in put) + sum(i.kind == "refused" for i in items)
    errors = lab.check(items, expected, results)
    problems = set(lab.keys("problems/"))
    for p in put:
        if p.stray:
            assert f"{PREFIX}/problems/{p.key.removeprefix(PREFIX + '/')}" in problems, p.key
    assert lab.keys("elsewhere/") == [outside]
    assert sum(r.strays_set_aside for r in results) == len({p.key for p in put if p.stray})
    for message in errors:  # a notice for an object with unreadable lines carries the first ones (escaped, cut)
        body = message["Body"]
        if body.startswith('{"format":"delayed-delivery-bucket-object/2"'):
            notice = json.loads(body)
            assert len(notice["lines"]) == min(notice["bad_lines"], 5)
            assert all("raw" in line for line in notice["lines"])


def _entry(message_id: str, dest: str, body: str, due_ms: int, **changes: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"i": message_id, "q": dest, "b": body, "a": {"kind": ["String", "s", "k"]}}
    entry.update({"d": due_ms, "s": START_MS})
    entry.update(changes)
    return entry


def _bad_entry(case: str, message_id: str, dest: str, due_ms: int) -> str:
    """An envelope entry (JSON text) that is one bad item, or one message the timer refuses."""
    changes: dict[str, dict[str, Any]] = {
        "huge-due": {"d": 10**400},
        "surrogate-id": {"i": "\ud800" + message_id},
        "nul-body": {"b": "a\x00b"},
        "reserved": {"a": {"DelayedDelivery.Delivery": ["String", "s", "x"]}},
        "nul-attr": {"a": {"kind": ["String", "s", "\x00"]}},
        "not-a-queue": {"q": "not a queue!"},
        "missing-queue": {"q": f"gone{dest}"},
        "too-big": {"b": "y" * 70_000},
        "negative-due": {"d": -1},
        "surrogate-attr": {"a": {"kind": ["String", "s", "a\ud800"]}},
        "no-body": {"b": None},
    }
    if case == "deep":
        return '{"i":"' + message_id + '","q":"' + dest + '","b":"x","d":1,"a":' + _nested(10) + "}"
    if case == "not-object":
        return '"just text"'
    if case == "huge-digits":
        return '{"i":"' + message_id + '","q":"' + dest + '","b":"x","d":1' + "0" * 5_000 + "}"
    return json.dumps(_entry(message_id, dest, "x", due_ms, **changes[case]))


BAD_ENTRIES = [
    "huge-due",
    "surrogate-id",
    "nul-body",
    "reserved",
    "nul-attr",
    "not-a-queue",
    "missing-queue",
    "too-big",
    "negative-due",
    "surrogate-attr",
    "no-body",
    "deep",
    "not-object",
    "huge-digits",
]
#: Whole records that are not envelopes: one error-queue message each.
BAD_RECORDS = {
    "no-attribute": (None, '{"v":1,"m":[]}'),
    "version-2": ("2", '{"v":1,"m":[]}'),
    "not-json": ("1", "not json"),
    "deep": ("1", '{"v":1,"m":[' + _nested(1_000) + "]}"),
    "huge": ("1", '{"v":1,"m":[{"i":"x","q":"q","b":"' + "z" * 1_500_000 + '","d":1}]}'),
    "too-many": ("1", '{"v":1,"m":[' + ",".join(['{"i":"x","q":"q","b":"b","d":1}'] * 501) + "]}"),
    "nul": ("1", '{"v":1,"m":[\x00]}'),
    "surrogate": ("1", '{"v":1,"m":["\ud800"]}'),
    "empty": ("1", ""),
    "no-messages": ("1", '{"v":1,"m":{}}'),
    "body-not-text": ("1", None),
    "not-a-record": (None, None),
}


def _record(body: str | None, version: str | None) -> dict[str, Any]:
    attributes = {} if version is None else {INGEST_ATTRIBUTE: {"dataType": "String", "stringValue": version}}
    return {"messageId": str(uuid.uuid4()), "receiptHandle": "rh", "body": body, "messageAttributes": attributes}


@settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture], phases=PHASES
)
@given(data=st.data())
def test_hostile_ingest_records_never_take_the_ingest_the_timer_or_their_neighbours_down(
    s3: Any, sqs: Any, data: st.DataObject
) -> None:
    lab = Lab(s3, sqs)
    config = BucketTierConfig(bucket_name=lab.bucket, prefix=PREFIX, settings=lab.settings)
    handler = build_ingest_handler(config, s3=s3, sqs=sqs, clock=lab.clock)
    records: list[Any] = []
    items: list[Item] = []
    bad_records = 0
    for r in range(data.draw(st.integers(2, 8))):  # two examples' worth of records (1-4 each before)
        if data.draw(st.integers(0, 4)) == 0:
            name = data.draw(st.sampled_from(sorted(BAD_RECORDS)))
            version, body = BAD_RECORDS[name]
            records.append("not a record" if name == "not-a-record" else _record(body, version))
            bad_records += 1
            continue
        texts = []
        for n in range(data.draw(st.integers(1, 6))):
            message_id, due_ms = f"m{lab.tag}-{r}-{n}", START_MS + data.draw(st.integers(0, 25_000))
            if data.draw(st.booleans()):
                body = f"body {message_id}"
                texts.append(json.dumps(_entry(message_id, lab.orders, body, due_ms)))
                items.append(Item(texts[-1], "ok", body))
            else:
                texts.append(_bad_entry(data.draw(st.sampled_from(BAD_ENTRIES)), message_id, lab.orders, due_ms))
                items.append(Item(texts[-1], "refused"))
        records.append(_record('{"v":1,"m":[' + ",".join(texts) + "]}", "1"))
    for t in range(data.draw(st.integers(0, 2))):  # SQS delivers a record twice: its messages still arrive once
        texts = []
        for n in range(data.draw(st.integers(1, 3))):
            body = f"body m{lab.tag}-twice-{t}-{n}"
            texts.append(json.dumps(_entry(f"m{lab.tag}-twice-{t}-{n}", lab.orders, body, START_MS + 7_000 + n)))
            items.append(Item(texts[-1], "ok", body))
        twice = _record('{"v":1,"m":[' + ",".join(texts) + "]}", "1")
        records += [twice, dict(twice, messageId=str(uuid.uuid4()))]
    response = handler({"Records": records}, LocalLambdaContext())
    assert response == {"batchItemFailures": []}
    results = lab.run_timer()
    lab.check(items, bad_records + sum(i.kind == "refused" for i in items), results)


# Regressions found by the fuzz above (each failed before its fix).


def _put_lines(lab: Lab, due_ms: int, lines: list[str], count: int | None = None) -> str:
    bucket = bucket_of(START + timedelta(milliseconds=due_ms - START_MS), START, lab.levels)
    header = json.dumps({"v": 1, "level": bucket.level, "bucket": bucket.iso, "count": count or len(lines)})
    key = f"{PREFIX}/{bucket.level}/{bucket.iso}/{_hash()}-{len(lines)}.jsonl.gz"
    data = gzip.compress("\n".join([header, *lines, ""]).encode("utf-8", "surrogatepass"), mtime=0)
    lab.s3.put_object(Bucket=lab.bucket, Key=key, Body=data)
    return key


def test_reserved_attributes_and_text_sqs_refuses_go_to_the_error_queue_not_the_destination(s3: Any, sqs: Any) -> None:
    lab = Lab(s3, sqs)
    due = START_MS + 3_000
    good = _line(f"m{lab.tag}-ok", lab.orders, b"good", due)
    reserved = _line(f"m{lab.tag}-r", lab.orders, b"r", due + 1, attributes={DELIVERY_HEADER: ["String", "s", "x"]})
    nul = _line(f"m{lab.tag}-n", lab.orders, b"n", due + 2, attributes={"kind": ["String", "s", "a\x00b"]})
    _put_lines(lab, due, [json.dumps(good), json.dumps(reserved), json.dumps(nul)])
    results = lab.run_timer()
    errors = lab.check([Item("", "ok", "good")], 2, results)
    reasons = sorted(m["MessageAttributes"][FAILURE_REASON]["StringValue"] for m in errors)
    assert "reserved" in reasons[0] + reasons[1] and "SQS refuses" in reasons[0] + reasons[1]


def test_a_key_the_tier_cannot_name_is_set_aside_under_problems_and_neighbours_go_out(s3: Any, sqs: Any) -> None:
    lab = Lab(s3, sqs)
    due = START_MS + 3_000
    _put_lines(lab, due, [json.dumps(_line(f"m{lab.tag}-ok", lab.orders, b"good", due))])
    stray = f"{PREFIX}/fine/2031-01-01T00:00:03Z/{_hash()}-{10**30}.jsonl.gz"
    s3.put_object(Bucket=lab.bucket, Key=stray, Body=b"someone else's")
    results = lab.run_timer()
    lab.check([Item("", "ok", "good")], 0, results)
    copy = f"{PREFIX}/problems/{stray.removeprefix(PREFIX + '/')}"
    assert s3.get_object(Bucket=lab.bucket, Key=copy)["Body"].read() == b"someone else's"
    assert sum(r.strays_set_aside for r in results) == 1


def test_a_notice_for_an_unreadable_line_carries_the_line_escaped_and_cut(s3: Any, sqs: Any) -> None:
    lab = Lab(s3, sqs)
    due = START_MS + 3_000
    bad = '{"id":"x","destination":"\x00\xe9","body":"' + "q" * 20_000 + '"}'
    _put_lines(lab, due, [bad])
    results = lab.run_timer()
    [notice] = lab.check([], 1, results)
    assert notice["Body"].isascii()
    [document] = json.loads(notice["Body"])["lines"]  # the object's one bad line
    assert document["raw"] == bad.encode()[: len(document["raw"].encode())].decode()  # the line's start, as read
    assert document["raw"].startswith('{"id":"x","destination":"\x00\xe9"') and document["truncated"] is True
    assert document["raw_bytes"] == len(bad.encode()) and document["id"] is None  # not JSON: no id read


def test_a_notice_too_large_for_the_error_queue_goes_in_reduced_form(s3: Any, sqs: Any) -> None:
    lab = Lab(s3, sqs)
    sqs.set_queue_attributes(QueueUrl=lab.urls[lab.errors], Attributes={"MaximumMessageSize": "4096"})
    _put_lines(lab, START_MS + 3_000, ['{"id":"x","bad":"' + "\u00e9" * 4_000 + '"}'])
    results = lab.run_timer()
    [notice] = lab.check([], 1, results)
    document = json.loads(notice["Body"])
    assert "lines" not in document and "raw" not in notice["Body"]  # reduced: the raw lines left out
    assert document["ids"] == ["x"] and document["bad_lines"] == 1 and document["copy"].startswith(PREFIX)


def test_an_ingest_record_too_large_for_the_error_queue_is_cut_to_fit_not_retried_forever(s3: Any, sqs: Any) -> None:
    lab = Lab(s3, sqs)
    handler = build_ingest_handler(
        BucketTierConfig(bucket_name=lab.bucket, prefix=PREFIX, settings=lab.settings), s3=s3, sqs=sqs, clock=lab.clock
    )
    version, body = BAD_RECORDS["huge"]
    good = json.dumps(_entry(f"m{lab.tag}-ok", lab.orders, "good", START_MS + 3_000))
    records = [_record(body, version), _record('{"v":1,"m":[' + good + "]}", "1")]
    assert handler({"Records": records}, LocalLambdaContext()) == {"batchItemFailures": []}
    [copy] = lab.drain(lab.errors)
    assert (
        len(copy["Body"]) < SMALL_QUEUE
        and "cut to its first" in copy["MessageAttributes"][FAILURE_REASON]["StringValue"]
    )
    results = lab.run_timer()
    lab.check([Item("", "ok", "good")], 0, results)


def test_a_lease_object_nested_too_deep_is_treated_as_expired(s3: Any, sqs: Any) -> None:
    lab = Lab(s3, sqs)
    due = START_MS + 3_000
    key = _put_lines(lab, due, [json.dumps(_line(f"m{lab.tag}-ok", lab.orders, b"good", due))])
    lease = f"{PREFIX}/leases/fine/{key.split('/')[3]}"
    s3.put_object(Bucket=lab.bucket, Key=lease, Body=_nested(3_000).encode())
    results = lab.run_timer()
    lab.check([Item("", "ok", "good")], 0, results)


def test_an_unexpected_failure_in_one_bucket_leaves_the_others_going(
    s3: Any, sqs: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    lab = Lab(s3, sqs)
    first, second = START_MS + 3_000, START_MS + 5_000
    broken = _put_lines(lab, first, [json.dumps(_line(f"m{lab.tag}-a", lab.orders, b"first", first))])
    _put_lines(lab, second, [json.dumps(_line(f"m{lab.tag}-b", lab.orders, b"second", second))])
    real = lab.store.open
    calls = Counter[str]()

    def open_(key: str) -> Any:  # the timer reads every object through open
        calls[key] += 1
        if key == broken and calls[key] == 1:
            raise ValueError("a bug")
        return real(key)

    monkeypatch.setattr(lab.store, "open", open_)
    results = lab.run_timer()
    assert sum(r.buckets_failed for r in results) == 1
    lab.check([Item("", "ok", "first"), Item("", "ok", "second")], 0, [])


def test_a_lone_surrogate_in_an_attribute_is_one_unreadable_line_not_a_blocked_coarse_bucket(s3: Any, sqs: Any) -> None:
    lab = Lab(s3, sqs)
    due = START_MS + 22_000  # coarse at the start: cascaded (written again) before it is dispatched
    good = json.dumps(_line(f"m{lab.tag}-ok", lab.orders, b"good", due))
    bad = json.dumps(_line(f"m{lab.tag}-s", lab.orders, b"s", due + 1, attributes={"kind": ["String", "s", "a\ud800"]}))
    key = _put_lines(lab, due, [good, bad])
    assert "/coarse/" in key
    results = lab.run_timer()
    [notice] = lab.check([Item("", "ok", "good")], 1, results)
    assert "lone surrogate" in notice["MessageAttributes"][FAILURE_REASON]["StringValue"]


def test_strays_are_set_aside_a_bounded_number_a_listing(s3: Any, sqs: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    lab = Lab(s3, sqs)
    monkeypatch.setattr(timer_module, "MAX_STRAYS_PER_LISTING", 3)
    for n in range(5):
        s3.put_object(Bucket=lab.bucket, Key=f"{PREFIX}/fine/stray-{n}", Body=b"x")
    timer = BucketTimer(lab.store, lab.sqs, lab.settings, lab.clock, owner="fuzz", lease_seconds=5)
    assert [timer.run().strays_set_aside, timer.run().strays_set_aside] == [3, 2]
    assert len(lab.keys("problems/fine/")) == 5 and lab.keys("fine/") == []
