"""Per-bucket leases on moto S3: one of two timers gets a bucket; an expired lease is taken over, exactly once."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime
from typing import Any

from delayed_delivery.aws.tier.lease import BucketLeases
from delayed_delivery.aws.tier.store import S3BucketStore
from delayed_delivery.clock import ManualClock
from delayed_delivery.timebuckets.wheel import FINE, BucketKey

BUCKET = BucketKey(FINE, datetime(2031, 2, 3, 4, 5, tzinfo=UTC))


def _leases(s3: Any, bucket: str, clock: ManualClock, owner: str) -> BucketLeases:
    return BucketLeases(S3BucketStore(s3, bucket, "dd/b"), clock, owner, seconds=30)


def test_two_timers_one_gets_the_bucket_and_release_frees_it(s3: Any, tier_bucket: str) -> None:
    clock = ManualClock(datetime(2031, 2, 3, 4, 0, tzinfo=UTC))
    first, second = _leases(s3, tier_bucket, clock, "a"), _leases(s3, tier_bucket, clock, "b")
    lease = first.acquire(BUCKET)
    assert lease is not None and lease.owner == "a" and lease.key == "dd/b/leases/fine/2031-02-03T04:05:00Z"
    assert second.acquire(BUCKET) is None
    stored = json.loads(s3.get_object(Bucket=tier_bucket, Key=lease.key)["Body"].read())
    assert stored["owner"] == "a" and stored["expires_at_ms"] == int(lease.expires_at.timestamp() * 1000)
    first.release(lease)
    taken = second.acquire(BUCKET)
    assert taken is not None and taken.owner == "b"


def test_concurrent_takers_race_and_exactly_one_wins(s3: Any, tier_bucket: str) -> None:
    clock = ManualClock(datetime(2031, 2, 3, 4, 0, tzinfo=UTC))
    won: list[str] = []
    barrier = threading.Barrier(6)

    def take(owner: str) -> None:
        leases = _leases(s3, tier_bucket, clock, owner)
        barrier.wait()
        if leases.acquire(BUCKET) is not None:
            won.append(owner)

    threads = [threading.Thread(target=take, args=(str(n),)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1


def test_a_crashed_holders_lease_expires_and_is_taken_over_once(s3: Any, tier_bucket: str) -> None:
    clock = ManualClock(datetime(2031, 2, 3, 4, 0, tzinfo=UTC))
    crashed = _leases(s3, tier_bucket, clock, "crashed")
    old = crashed.acquire(BUCKET)
    assert old is not None
    later, other = _leases(s3, tier_bucket, clock, "later"), _leases(s3, tier_bucket, clock, "other")
    clock.advance(29)
    assert later.acquire(BUCKET) is None  # not expired yet
    clock.advance(2)
    taken = later.acquire(BUCKET)
    assert taken is not None and taken.etag != old.etag
    assert other.acquire(BUCKET) is None  # the takeover wrote a fresh expiry
    crashed.release(old)  # the crashed holder coming back must not free the new holder's lease
    assert other.acquire(BUCKET) is None
    later.release(taken)
    assert other.acquire(BUCKET) is not None


def test_an_unreadable_lease_counts_as_expired(s3: Any, tier_bucket: str) -> None:
    clock = ManualClock(datetime(2031, 2, 3, 4, 0, tzinfo=UTC))
    leases = _leases(s3, tier_bucket, clock, "a")
    s3.put_object(Bucket=tier_bucket, Key=leases.key(BUCKET), Body=b"not json")
    assert leases.acquire(BUCKET) is not None
