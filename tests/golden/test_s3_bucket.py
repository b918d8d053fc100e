"""The S3 time-bucket object (``timebuckets.format``): today's reader reads every version, today's writer the newest.

The golden ``s3_bucket.vN.json`` holds the object key, the decompressed lines and the base64 of the object. The
writer is compared on the key and the decompressed bytes (gzip's compressed bytes may differ between zlib builds).
The fixed inputs below are part of the golden: never edit them (add new ones beside them for a new version).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
from datetime import UTC, datetime
from typing import Any

import pytest

from delayed_delivery.timebuckets.format import BucketMessage, bucket_object_key, decode_bucket, encode_bucket
from delayed_delivery.timebuckets.wheel import FINE, BucketKey, parse_object_key_count
from tests.golden import wire

KIND = "s3_bucket"
PREFIX = "delayed-delivery/buckets"
BUCKET = BucketKey(FINE, datetime(2031, 2, 3, 4, 5, tzinfo=UTC))
#: 2031-02-03T04:05:00Z in epoch ms.
START_MS = 1_927_857_900_000
MESSAGES = (
    BucketMessage(
        "golden-bucket-b",
        "orders",
        "héllo wörld ✓ \x00\x01\x02".encode(),
        START_MS + 59_999,
        {
            "kind": {"DataType": "String", "StringValue": "order"},
            "trace": {"DataType": "Binary", "BinaryValue": b"\x00\x01\xfe\xff golden"},
            "priority": {"DataType": "Number", "StringValue": "7"},
        },
        hops=3,
        sent_at_ms=wire.SENT_MS,
    ),
    BucketMessage("golden-bucket-a", "orders.fifo", b'{"order":42}', START_MS + 1_234),
    BucketMessage("golden-bucket-c", "payments", b"", START_MS + 1_234, {}, hops=0, sent_at_ms=wire.SENT_MS + 1),
)


def _value() -> dict[str, Any]:
    data = encode_bucket(BUCKET, MESSAGES)
    lines = gzip.decompress(data).decode("utf-8").splitlines()
    return {
        "key": bucket_object_key(PREFIX, BUCKET, MESSAGES),
        "lines": [json.loads(line) for line in lines],
        "object": base64.b64encode(data).decode("ascii"),
    }


def _same_write(today: dict[str, Any], golden: dict[str, Any]) -> bool:
    inflated = gzip.decompress(base64.b64decode(golden["object"]))
    mine = gzip.decompress(base64.b64decode(today["object"]))
    return today["key"] == golden["key"] and today["lines"] == golden["lines"] and mine == inflated


def test_bucket_writer_writes_the_newest_golden_object() -> None:
    today = _value()
    known = wire.versions(KIND)
    if known and _same_write(today, json.loads((wire.GOLDEN / known[-1]).read_text(encoding="utf-8"))):
        return
    name = f"{KIND}.v{wire.version_of(known[-1]) + 1 if known else 1}.json"
    if known and not os.environ.get("GOLDEN_ADD_VERSION"):
        pytest.fail(
            f"today's writer no longer writes {known[-1]}: objects in that format may still be waiting, so the "
            f"reader must keep reading it. If the change is meant, run with GOLDEN_ADD_VERSION=1 to add {name}"
        )
    (wire.GOLDEN / name).write_text(wire.dumps(today), encoding="utf-8")
    pytest.fail(f"wrote the new golden file {name}: review it, commit it and run again")


@pytest.mark.parametrize("golden", wire.versions(KIND))
def test_bucket_reader_reads_every_golden_object(golden: str) -> None:
    stored = json.loads((wire.GOLDEN / golden).read_text(encoding="utf-8"))
    contents = decode_bucket(base64.b64decode(stored["object"]))
    assert contents.complete and contents.problem is None and contents.poison == ()
    format_version = 1 if wire.version_of(golden) <= 2 else 2  # golden v3: object format v2 (text bodies as text)
    assert (contents.version, contents.bucket, contents.count) == (format_version, BUCKET, 3)
    by_id = {m.message_id: m for m in MESSAGES}
    assert [m.message_id for m in contents.messages] == ["golden-bucket-a", "golden-bucket-c", "golden-bucket-b"]
    for message in contents.messages:
        expected = by_id[message.message_id]
        assert message == expected
        assert message.body == expected.body and dict(message.attributes) == dict(expected.attributes)
    assert stored["key"].startswith(f"{PREFIX}/fine/2031-02-03T04:05:00Z/")
    parsed = parse_object_key_count(stored["key"])  # v1 keys carry no count, v2 keys the count of messages
    assert (parsed.prefix, parsed.bucket) == (PREFIX, BUCKET)
    assert parsed.message_count == (None if wire.version_of(golden) == 1 else 3)
    if wire.version_of(golden) >= 4:  # key v3: the hash is the object's own content, so no write replaces another
        assert parsed.content_hash == hashlib.sha256(gzip.decompress(base64.b64decode(stored["object"]))).hexdigest()
    assert stored["lines"][0] == {"v": format_version, "level": "fine", "bucket": "2031-02-03T04:05:00Z", "count": 3}
    bodies = [("t" in line, "body" in line) for line in stored["lines"][1:]]
    assert bodies == ([(False, True)] * 3 if format_version == 1 else [(True, False), (True, False), (False, True)])
