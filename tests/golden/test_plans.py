"""The burst formats (#24): a dispatch plan object, a partition's progress object, a dispatch task message; and (#31) a
partition's seen snapshot.

Each golden ``<kind>.vN.json`` holds what today's writer wrote for fixed inputs, as text; the writer test fails when
today's bytes differ from the newest (add a version with ``GOLDEN_ADD_VERSION=1``), the reader test reads every
version. Never edit a golden file.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from delayed_delivery.aws.tier.plan_store import SeenName, seen_name
from delayed_delivery.timebuckets.plans import (
    DispatchPlan,
    DispatchTask,
    PartitionProgress,
    PieceCounts,
    decode_plan,
    decode_progress,
    decode_task,
    encode_plan,
    encode_progress,
    encode_task,
)
from delayed_delivery.timebuckets.seen import SeenSnapshot, decode_seen, encode_seen
from delayed_delivery.timebuckets.wheel import FINE, BucketKey
from tests.golden import wire
from tests.golden.test_writers import _check

BUCKET = BucketKey(FINE, datetime(2031, 2, 3, 4, 5, tzinfo=UTC))
PLAN_MS = 1_927_857_300_000
OBJECTS = (f"{'a' * 64}-1000.jsonl.gz", f"{'0123456789abcdef' * 4}-7.jsonl.gz", f"{'f' * 64}.jsonl.gz")
PLAN = DispatchPlan(BUCKET, PLAN_MS, 8, OBJECTS)
PROGRESS = PartitionProgress(
    BUCKET,
    PLAN_MS,
    partition=3,
    partitions=8,
    object=1,
    line=250,
    owner="2f1c7a9e-worker",
    lease_until_ms=PLAN_MS + 180_000,
    updated_ms=PLAN_MS + 60_000,
    counts=PieceCounts(1_234, duplicates=2, cancelled=1, rescheduled=1, to_error_queue=3, kept_for_retry=4, pieces=5),
)
TASK = DispatchTask(BUCKET, PLAN_MS, 3, 8)
SEEN = SeenSnapshot(
    BUCKET,
    PLAN_MS,
    partition=3,
    partitions=8,
    object=1,
    line=250,
    done=False,
    overflow=0,
    entries=(
        ("order-42", 1_927_857_905_000, 0x3F1C7A9E00112233, False),
        ("order-43", 1_927_857_905_250, 0x00000000000000FF, True),
        ('a "quoted" id é', 1_927_857_905_999, 0xFFFFFFFFFFFFFFFF, False),
    ),
)
#: What one piece met, kept after it (#31): written at ``<plan ms>-<k>-<object>-<line>.jsonl.gz``.
SEEN_DELTA = replace(SEEN, entries=SEEN.entries[1:], delta=True)
KINDS = ("s3_plan", "s3_progress", "sqs_dispatch_task", "s3_seen", "s3_seen_delta")


def _today(kind: str) -> dict[str, Any]:
    if kind == "s3_plan":
        return {"key_suffix": f"fine/{BUCKET.iso}.json", "text": encode_plan(PLAN).decode("ascii")}
    if kind == "s3_progress":
        return {"key_suffix": f"fine/{BUCKET.iso}/3.json", "text": encode_progress(PROGRESS).decode("ascii")}
    if kind == "s3_seen":
        text = gzip.decompress(encode_seen(SEEN)).decode("ascii")
        return {"key_suffix": f"seen/fine/{BUCKET.iso}/{PLAN_MS}-3.jsonl.gz", "text": text}
    if kind == "s3_seen_delta":
        text = gzip.decompress(encode_seen(SEEN_DELTA)).decode("ascii")
        return {"key_suffix": f"seen/fine/{BUCKET.iso}/{PLAN_MS}-3-1-250.jsonl.gz", "text": text}
    return {"MessageBody": encode_task(TASK)}


@pytest.mark.parametrize("kind", KINDS)
def test_the_burst_writers_write_the_newest_golden(kind: str) -> None:
    _check(kind, _today(kind))


@pytest.mark.parametrize("golden", [name for kind in KINDS for name in wire.versions(kind)])
def test_every_golden_burst_format_is_read(golden: str) -> None:
    stored = json.loads((wire.GOLDEN / golden).read_text(encoding="utf-8"))
    if golden.startswith("s3_plan"):
        assert decode_plan(stored["text"]) == PLAN
        assert decode_plan(stored["text"]).keys("p")[0] == f"p/fine/2031-02-03T04:05:00Z/{OBJECTS[0]}"
    elif golden.startswith("s3_progress"):
        assert decode_progress(stored["text"]) == PROGRESS
    elif golden.startswith("s3_seen_delta"):
        assert decode_seen(gzip.compress(stored["text"].encode("ascii"))) == SEEN_DELTA
        assert seen_name(stored["key_suffix"]) == SeenName(PLAN_MS, 3, (1, 250))
    elif golden.startswith("s3_seen"):
        assert seen_name(stored["key_suffix"]) == SeenName(PLAN_MS, 3, None)
        assert decode_seen(gzip.compress(stored["text"].encode("ascii"))) == SEEN
    else:
        assert decode_task(stored["MessageBody"]) == TASK


def test_every_burst_kind_has_a_golden() -> None:
    for kind in KINDS:
        assert wire.versions(kind), f"no golden file for {kind}"
