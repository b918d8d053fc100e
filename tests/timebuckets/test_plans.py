"""The burst formats read back what they wrote, refuse crafted input with a reason, and split ids the same way
everywhere."""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayed_delivery.errors import InvalidMessageError
from delayed_delivery.timebuckets.format import BucketMessage, BucketStream, RawLine, encode_bucket, line_id
from delayed_delivery.timebuckets.plans import (
    MAX_PARTITIONS,
    MAX_PLAN_OBJECTS,
    MAX_TASK_BYTES,
    DispatchPlan,
    DispatchTask,
    decode_plan,
    decode_progress,
    decode_task,
    encode_plan,
    encode_progress,
    encode_task,
    line_partition,
    partition_of,
)
from delayed_delivery.timebuckets.wheel import COARSE, BucketKey
from tests.golden.test_plans import BUCKET, OBJECTS, PLAN, PLAN_MS, PROGRESS, TASK
from tests.timebuckets.test_format import BUCKET as BUCKET_FOR_LINES
from tests.timebuckets.test_format import START_MS, messages


def test_round_trips() -> None:
    assert decode_plan(encode_plan(PLAN)) == PLAN
    assert decode_progress(encode_progress(PROGRESS)) == PROGRESS
    assert decode_task(encode_task(TASK)) == TASK
    assert decode_task(encode_task(TASK).encode()) == TASK


def test_partitions_are_stable_and_spread() -> None:
    assert [partition_of(f"order-{n}", 8) for n in range(8)] == [partition_of(f"order-{n}", 8) for n in range(8)]
    assert partition_of("order-1", 8) == 4 and partition_of("é", 16) == partition_of("é", 16)  # pinned: a contract
    spread = Counter(partition_of(f"m-{n}", 8) for n in range(8_000))
    assert len(spread) == 8 and min(spread.values()) > 850
    assert partition_of(None, 8, 13) == 5  # a line naming no id: by its object


def _plan(**fields: object) -> bytes:
    return json.dumps(json.loads(encode_plan(PLAN)) | fields).encode()


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"[]", "not an object"),
        (b"{", "not JSON"),
        (_plan(format="delayed-delivery-plan/9"), "format"),
        (_plan(bucket="2031-02-03T04:05:30"), "of the form"),
        (_plan(partitions=0), "partitions"),
        (_plan(partitions=MAX_PARTITIONS + 1), "partitions"),
        (_plan(partitions=True), "partitions"),
        (_plan(created_ms=-5), "created_ms"),
        (_plan(objects=[]), "1 to"),
        (_plan(objects="x"), "list of names"),
        (_plan(objects=[OBJECTS[0], OBJECTS[0]]), "twice"),
        (_plan(objects=["../../etc/passwd"]), "not an object name"),
        (_plan(objects=["zz.jsonl.gz"]), "not a bucket object key"),
        (_plan(objects=[f"{'a' * 64}.jsonl.gz"] * 2), "twice"),
        (b" " * (3 * 1024 * 1024), "more than"),
    ],
)
def test_a_crafted_plan_is_refused_with_a_reason(data: bytes, reason: str) -> None:
    with pytest.raises(InvalidMessageError, match=reason):
        decode_plan(data)


def test_a_plan_is_bounded_and_for_a_fine_bucket() -> None:
    with pytest.raises(InvalidMessageError, match="fine bucket"):
        DispatchPlan(BucketKey(COARSE, BUCKET.start.replace(hour=0, minute=0)), PLAN_MS, 1, OBJECTS)
    names = tuple(f"{n:064x}-1.jsonl.gz" for n in range(MAX_PLAN_OBJECTS + 1))
    with pytest.raises(InvalidMessageError, match="objects"):
        DispatchPlan(BUCKET, PLAN_MS, 1, names)


def _progress(**fields: object) -> bytes:
    return json.dumps(json.loads(encode_progress(PROGRESS)) | fields).encode()


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (_progress(partition=8), "partition"),
        (_progress(object=-1), "object"),
        (_progress(done="yes"), "done"),
        (_progress(owner="a\nb"), "owner"),
        (_progress(owner="x" * 200), "owner"),
        (_progress(counts={"sent": 1}), "counts"),
        (_progress(counts={**json.loads(encode_progress(PROGRESS))["counts"], "sent": -1}), "count sent"),
        (_progress(counts={**json.loads(encode_progress(PROGRESS))["counts"], "sent": "many"}), "count sent"),
        (_progress(lease_until_ms=10**20), "lease_until_ms"),
        (b'{"format":"delayed-delivery-progress/1","counts":{"a":[[[[1]]]]}}', "nested"),
    ],
)
def test_crafted_progress_is_refused_with_a_reason(data: bytes, reason: str) -> None:
    with pytest.raises(InvalidMessageError, match=reason):
        decode_progress(data)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("", "not JSON"),
        ('{"format":"delayed-delivery-dispatch/1"}', "not a whole number"),
        (encode_task(TASK).replace("2031-02-03T04:05:00Z", "soon"), "of the form"),
        (encode_task(TASK).replace('"partition":3', '"partition":8'), "partition"),
        (encode_task(TASK).replace('"partitions":8', '"partitions":300'), "partitions"),
        (encode_task(TASK).replace("}", ',"extra":1}'), "unknown fields"),
        (encode_task(TASK) + " " * MAX_TASK_BYTES, "more than"),
    ],
)
def test_a_crafted_task_is_refused_with_a_reason(body: str, reason: str) -> None:
    with pytest.raises(InvalidMessageError, match=reason):
        decode_task(body)


def test_progress_knows_who_holds_a_partition() -> None:
    held = replace(PROGRESS, owner="a", lease_until_ms=1_000)
    assert held.held_by_other("b", 999) and not held.held_by_other("a", 999) and not held.held_by_other("b", 1_000)
    assert not replace(held, owner="").held_by_other("b", 0)
    with pytest.raises(InvalidMessageError):
        DispatchTask(BUCKET, PLAN_MS, 0, 0)


@given(st.binary(max_size=300) | st.text(max_size=300))
def test_any_input_is_read_or_refused_never_an_exception(data: bytes | str) -> None:
    for decode in (decode_plan, decode_progress, decode_task):
        with contextlib.suppress(InvalidMessageError):
            decode(data)


@given(st.lists(messages, min_size=1, max_size=8, unique_by=lambda m: m.message_id), st.integers(1, 64))
def test_a_written_line_is_partitioned_as_its_id(batch: list[BucketMessage], partitions: int) -> None:
    data = encode_bucket(BUCKET_FOR_LINES, [replace(m, due_at_ms=START_MS) for m in batch])
    for index, raw in enumerate(BucketStream([data]).lines()):
        assert line_partition(raw, partitions, index) == partition_of(line_id(raw), partitions, index)


@pytest.mark.parametrize(
    "line",
    [b'{"id":"a\\u0042","destination":"q"}', b'{ "id" : "spaced" }', b'{"destination":"q","id":"late"}', b"junk"],
)
def test_a_hand_made_line_is_partitioned_as_its_id_too(line: bytes) -> None:
    raw = RawLine(3, line, len(line))
    assert line_partition(raw, 8, 3) == partition_of(line_id(raw), 8, 3)
