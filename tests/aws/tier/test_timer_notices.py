"""Notices are bounded per object (#23): a crafted object yields one error-queue notice, whatever it holds.

A valid header then 9,999 empty lines (65 KB) once produced 9,999 notices in 1,000 ``SendMessageBatch`` calls, and a
few such objects stalled their bucket. Now: one notice summarising the object's bad lines, the object copied under
``problems/``, the neighbours delivered on time.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from datetime import timedelta
from typing import Any

import pytest

from delayed_delivery.aws.tier.config import TierSettings
from delayed_delivery.aws.tier.notices import NOTICE_FORMAT, NOTICE_IDS, NOTICE_LINES
from delayed_delivery.aws.tier.timer import BucketTimer
from delayed_delivery.clock import ManualClock
from delayed_delivery.headers import FAILURE_REASON
from delayed_delivery.testing.aws.sqs import drain
from delayed_delivery.timebuckets.format import encode_bucket
from delayed_delivery.timebuckets.wheel import COARSE, FINE, BucketKey, bucket_of
from tests.aws.tier.timer_support import (
    PREFIX,
    SETTINGS,
    START,
    Recorder,
    make_store,
    make_timer,
    message,
    queue_url,
    run_for,
    total,
)

pytestmark = pytest.mark.moto


def _crafted(bucket_iso: str, lines: list[str], count: int) -> bytes:
    header = json.dumps({"v": 2, "level": "fine", "bucket": bucket_iso, "count": count})
    return gzip.compress(("\n".join([header, *lines]) + "\n").encode(), mtime=0)


def test_a_crafted_object_gives_one_notice_and_its_neighbours_go_out(
    s3: Any, sqs: Any, tier_bucket: str, tier_settings: TierSettings
) -> None:
    clock = ManualClock(START)
    queue_url(sqs, "orders")
    errors = queue_url(sqs, "errors")
    recorder = Recorder(clock).attach(sqs)
    store = make_store(s3, tier_bucket, tier_settings)
    due = START + timedelta(seconds=3)
    bucket = bucket_of(due, START, store.levels)
    assert bucket.level == FINE
    neighbours = [message(n, due + timedelta(milliseconds=n)) for n in range(5)]
    store.write_due(neighbours, START)
    keys = []
    empty = _crafted(bucket.iso, [" " * 5] * 9_999, 9_999)  # a valid header, then 9,999 blank lines: 60 KB
    assert len(gzip.decompress(empty)) < 65_536
    named = [f'{{"id":"lost-{n}","destination":"orders"}}' for n in range(150)]  # ids readable, lines not
    for data in (empty, empty[: len(empty) - 12], _crafted(bucket.iso, named, 151)):  # the second: cut short too
        key = f"{PREFIX}/fine/{bucket.iso}/{hashlib.sha256(data).hexdigest()}-9999.jsonl.gz"
        s3.put_object(Bucket=tier_bucket, Key=key, Body=data)
        keys.append(key)
    batches: list[int] = []
    sqs.meta.events.register(
        "provide-client-params.sqs.SendMessageBatch",
        lambda params, **_: batches.append(len(params["Entries"])) if params["QueueUrl"] == errors else None,
    )
    results = run_for(make_timer(store, sqs, tier_settings, clock), clock, 4)
    assert total(results, "buckets_failed") == 0 and total(results, "to_error_queue") == 3
    assert len(batches) == 1  # three notices in one request, not 1,000
    sent = {s.message_id: s for s in recorder.to("orders")}
    assert set(sent) == {m.message_id for m in neighbours}
    assert all(sent[m.message_id].arrives - m.due_at < timedelta(seconds=1) for m in neighbours)  # on time
    notices = {json.loads(m["Body"])["object"]: m for m in drain(sqs, errors)}
    assert set(notices) == set(keys)
    first = json.loads(notices[keys[0]]["Body"])
    assert first["format"] == NOTICE_FORMAT and first["bad_lines"] == 9_999 and first["problem"] is None
    assert [line["line"] for line in first["lines"]] == list(range(1, NOTICE_LINES + 1))
    assert first["reasons"] == [{"reason": first["lines"][0]["reason"], "lines": 9_999}]
    assert first["copy"] == f"{PREFIX}/problems/{keys[0].removeprefix(PREFIX + '/')}"
    reason = notices[keys[0]]["MessageAttributes"][FAILURE_REASON]["StringValue"]
    assert reason.startswith(f"9,999 line(s) of {keys[0]} cannot be read (first: line 1:") and first["copy"] in reason
    cut = json.loads(notices[keys[1]]["Body"])
    assert cut["problem"] and cut["bad_lines"] >= 1  # damaged as a whole and bad lines: still one notice
    ids = json.loads(notices[keys[2]]["Body"])
    assert ids["ids"] == [f"lost-{n}" for n in range(NOTICE_IDS)] and ids["more_ids"] == 50
    problems = s3.list_objects_v2(Bucket=tier_bucket, Prefix=f"{PREFIX}/problems/")["Contents"]
    assert sorted(p["Key"] for p in problems) == sorted(json.loads(n["Body"])["copy"] for n in notices.values())
    assert list(store.objects(FINE)) == []


def test_a_cascade_cut_over_groups_gives_one_notice_per_bad_object(
    s3: Any, sqs: Any, tier_bucket: str, tier_settings: TierSettings
) -> None:
    errors = queue_url(sqs, "errors")
    store = make_store(s3, tier_bucket, tier_settings)
    coarse = BucketKey(COARSE, START + timedelta(seconds=20))  # split by a run at START + 8 s
    good = [message(n, coarse.start + timedelta(seconds=n)) for n in range(6)]
    lines = gzip.decompress(encode_bucket(coarse, good, store.levels)).decode().splitlines()
    bad = [f'{{"id":"lost-{n}","destination":"orders"}}' for n in range(2_000)]
    mixed = [lines[1], *bad[:1_000], *lines[2:4], *bad[1_000:], *lines[4:]]  # good lines among 2,000 bad ones
    data = gzip.compress(("\n".join([lines[0].replace('"count":6', '"count":2006'), *mixed]) + "\n").encode(), mtime=0)
    key = f"{PREFIX}/coarse/{coarse.iso}/{hashlib.sha256(data).hexdigest()}-2006.jsonl.gz"
    s3.put_object(Bucket=tier_bucket, Key=key, Body=data)
    timer = BucketTimer(store, sqs, SETTINGS, ManualClock(START + timedelta(seconds=8)), owner="t", lease_seconds=30)
    timer.cascade_group_bytes = 8_192
    result = timer.run()  # the object is larger than a group: cut in many, one notice after its last line
    assert result.buckets_failed == 0 and result.cascaded_messages == 6 and result.to_error_queue == 1
    [notice] = drain(sqs, errors)
    document = json.loads(notice["Body"])
    assert document["object"] == key and document["bad_lines"] == 2_000 and document["problem"] is None
    assert len(document["ids"]) == NOTICE_IDS and document["more_ids"] == 1_900
    assert [line["id"] for line in document["lines"]] == [f"lost-{n}" for n in range(NOTICE_LINES)]
    assert sorted(m.message_id for o in store.objects(FINE) for m in store.read(o.key).messages) == sorted(
        m.message_id for m in good
    )
    assert list(store.objects(COARSE)) == []
