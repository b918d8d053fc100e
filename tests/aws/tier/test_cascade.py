"""The cascade by bytes: groups bounded by the bytes read whatever the keys say, a large object cut the same way every
run, a run that dies between a group's writes and its deletes leaves no copy, records applied only once gone."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

import pytest

from delayed_delivery.aws.tier.config import TierSettings
from delayed_delivery.aws.tier.store import S3BucketStore
from delayed_delivery.aws.tier.timer import BucketTimer
from delayed_delivery.cancellations import CancellationCache, InMemoryCancellationStore, cancel_request
from delayed_delivery.clock import ManualClock
from delayed_delivery.timebuckets.format import BucketMessage, encode_bucket, encoded_line_bytes
from delayed_delivery.timebuckets.wheel import COARSE, FINE, BucketKey
from tests.aws.tier.timer_support import PREFIX, SETTINGS, START, make_store, message, settled

#: The coarse bucket the timer splits at START + 8 s (compressed settings: coarse 10 s, margin 3 s).
COARSE_BUCKET = BucketKey(COARSE, START + timedelta(seconds=20))


class Crash(BaseException):
    """A kill: nothing catches it."""


def _messages(first: int, count: int, body: int = 200) -> list[BucketMessage]:
    return [message(n, COARSE_BUCKET.start + timedelta(milliseconds=97 * n % 10_000), body="b" * body) for n in
            range(first, first + count)]  # fmt: skip


def _timer(store: S3BucketStore, sqs: Any, tier: TierSettings, group: int, **kw: Any) -> BucketTimer:
    timer = BucketTimer(store, sqs, SETTINGS, ManualClock(START + timedelta(seconds=8)), owner="t", lease_seconds=30,
                        tier=TierSettings().with_(bucket_send_phase_ms=tier.bucket_send_phase_ms), **kw)  # fmt: skip
    timer.cascade_group_bytes = group  # below the setting's floor: groups of a few lines
    return timer


def _fine_ids(store: S3BucketStore) -> Counter[str]:
    ids: Counter[str] = Counter()
    for stored in store.objects(FINE):
        ids.update(m.message_id for m in store.read(stored.key).messages)
    return ids


def _writes(store: S3BucketStore, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The decompressed bytes of every object the cascade writes."""
    sizes: list[int] = []
    real = store.write

    def write(bucket: BucketKey, messages: list[BucketMessage]) -> list[str]:
        sizes.append(sum(encoded_line_bytes(m) for m in messages))
        return real(bucket, messages)

    monkeypatch.setattr(store, "write", write)
    return sizes


def test_groups_are_bounded_by_bytes_read_not_by_the_counts_in_keys(
    s3: Any, sqs: Any, tier_bucket: str, tier_settings: TierSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store(s3, tier_bucket, tier_settings)
    line = encoded_line_bytes(_messages(0, 1)[0])
    for first in range(0, 300, 50):  # six objects of 50, each key claiming a single message
        batch = _messages(first, 50)
        key = f"{PREFIX}/coarse/{COARSE_BUCKET.iso}/{first:064x}-1.jsonl.gz"
        s3.put_object(Bucket=tier_bucket, Key=key, Body=encode_bucket(COARSE_BUCKET, batch, store.levels))
    sizes = _writes(store, monkeypatch)
    group = 120 * line  # two objects and a bit: groups of two objects
    result = _timer(store, sqs, tier_settings, group).run()
    assert (result.cascaded_objects, result.cascaded_messages) == (6, 300)
    assert list(store.objects(COARSE)) == []
    groups = len(sizes) // 10  # each group writes into the ten fine buckets of the coarse one
    assert groups == 3 and max(sizes) <= group
    assert _fine_ids(store) == Counter({f"m-{n}": 1 for n in range(300)})


def test_an_object_larger_than_a_group_is_cut_the_same_way_after_a_kill(
    s3: Any, sqs: Any, tier_bucket: str, tier_settings: TierSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store(s3, tier_bucket, tier_settings)
    [big] = store.write(COARSE_BUCKET, _messages(0, 400))
    store.write(COARSE_BUCKET, _messages(400, 20))
    line = encoded_line_bytes(_messages(0, 1)[0])
    real = store.write_due
    calls: list[int] = []

    def dies_at_the_third_cut(messages: Any, now: Any) -> Any:
        calls.append(len(messages))
        if len(calls) == 3:
            raise Crash
        return real(messages, now)

    monkeypatch.setattr(store, "write_due", dies_at_the_third_cut)
    with pytest.raises(Crash):
        _timer(store, sqs, tier_settings, 100 * line).run()
    assert big in [o.key for o in store.objects(COARSE)]  # not deleted: its last cut was not written
    monkeypatch.setattr(store, "write_due", real)
    result = _timer(store, sqs, tier_settings, 100 * line).run()
    assert result.cascaded_messages >= 400 and list(store.objects(COARSE)) == []  # the small one may have gone first
    assert _fine_ids(store) == Counter({f"m-{n}": 1 for n in range(420)})  # the cuts rewrote the same objects


def test_a_kill_between_a_groups_writes_and_its_deletes_leaves_no_copy(
    s3: Any, sqs: Any, tier_bucket: str, tier_settings: TierSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store(s3, tier_bucket, tier_settings)
    for first in range(0, 200, 40):
        store.write(COARSE_BUCKET, _messages(first, 40))
    line = encoded_line_bytes(_messages(0, 1)[0])
    real = store.delete
    deletes: list[int] = []

    def dies_at_the_second_delete(keys: Any) -> None:
        deletes.append(len(keys))
        if len(deletes) == 2:
            raise Crash
        real(keys)

    monkeypatch.setattr(store, "delete", dies_at_the_second_delete)
    with pytest.raises(Crash):
        _timer(store, sqs, tier_settings, 90 * line).run()
    monkeypatch.setattr(store, "delete", real)
    assert _timer(store, sqs, tier_settings, 90 * line).run().cascaded_objects == 3  # groups of two: the 2nd died
    assert _fine_ids(store) == Counter({f"m-{n}": 1 for n in range(200)})  # the group wrote the same keys again


def test_a_cancel_in_a_large_object_is_deleted_only_with_the_object(
    s3: Any, sqs: Any, tier_bucket: str, tier_settings: TierSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store(s3, tier_bucket, tier_settings)
    batch = _messages(0, 300)
    store.write(COARSE_BUCKET, batch)
    records = InMemoryCancellationStore()
    first = min(batch, key=lambda m: (m.due_at_ms, m.message_id))  # read in the first cut
    records.put(cancel_request("orders", first.message_id, now=START + timedelta(seconds=5), max_native_delay=2,
                               max_age=0))  # fmt: skip
    clock = ManualClock(START + timedelta(seconds=8))
    line = encoded_line_bytes(batch[0])
    real = store.delete

    def dies(keys: Any) -> None:
        raise Crash

    monkeypatch.setattr(store, "delete", dies)
    timer = BucketTimer(store, sqs, SETTINGS, clock, owner="t", lease_seconds=30,
                        cancellations=CancellationCache(records, 0, clock=clock))  # fmt: skip
    timer.cascade_group_bytes = 100 * line
    with pytest.raises(Crash):
        timer.run()
    assert records.live("orders") != []  # three cuts written, the object not deleted: the record stays
    monkeypatch.setattr(store, "delete", real)
    result = timer.run()
    assert result.cancelled == 1 and settled(records, "orders", first.due_at)  # settled once the object is gone
    assert first.message_id not in _fine_ids(store) and sum(_fine_ids(store).values()) == 299
