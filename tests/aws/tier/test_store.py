"""S3BucketStore on moto: idempotent writes, splitting, listing oldest first, reads, deletes in 1,000s, errors."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError

from delayed_delivery.aws.tier.config import BucketTierConfig, TierSettings
from delayed_delivery.aws.tier.store import DELETE_BATCH, ObjectMissingError, S3BucketStore, translate_s3_error
from delayed_delivery.errors import ConfigurationError, InvalidMessageError, TransientError
from delayed_delivery.timebuckets.format import BucketMessage, BucketStream
from delayed_delivery.timebuckets.wheel import COARSE, FINE, BucketKey, BucketLevel

NOW = datetime(2031, 2, 3, 4, 5, tzinfo=UTC)
PREFIX = "dd/buckets"


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def _message(n: int, due: datetime, body: bytes = b"x") -> BucketMessage:
    return BucketMessage(f"m-{n:05d}", "orders", body, _ms(due), {"k": {"DataType": "String", "StringValue": "v"}})


@pytest.fixture
def store(s3: Any, tier_bucket: str, tier_settings: TierSettings) -> S3BucketStore:
    return S3BucketStore(s3, tier_bucket, PREFIX, tier_settings.levels)


def _raw(s3: Any, bucket: str, key: str) -> bytes:
    return bytes(s3.get_object(Bucket=bucket, Key=key)["Body"].read())


def test_write_is_idempotent_and_reads_back(store: S3BucketStore, s3: Any, tier_bucket: str) -> None:
    bucket = BucketKey(FINE, NOW)
    batch = [_message(n, NOW + timedelta(milliseconds=n * 10)) for n in range(5)]
    keys = store.write(bucket, batch)
    again = store.write(bucket, list(reversed(batch)) + batch[:2])  # a retry, in another order, with repeats
    assert keys == again and len(keys) == 1
    assert keys[0].endswith("-5.jsonl.gz") and keys[0].startswith(f"{PREFIX}/fine/2031-02-03T04:05:00Z/")
    first = _raw(s3, tier_bucket, keys[0])
    store.write(bucket, batch)
    assert _raw(s3, tier_bucket, keys[0]) == first
    contents = store.read(keys[0])
    assert contents.complete and list(contents.messages) == batch
    assert [o.key for o in store.objects(FINE)] == keys


def test_write_splits_past_the_message_and_byte_bounds(s3: Any, tier_bucket: str) -> None:
    levels = BucketLevel(1, 10, 2)
    bucket = BucketKey(FINE, NOW)
    batch = [_message(n, NOW, b"y" * 300) for n in range(25)]
    by_count = S3BucketStore(s3, tier_bucket, PREFIX, levels, max_object_messages=10)
    keys = by_count.write(bucket, batch)
    assert [k.rsplit("-", 1)[1] for k in keys] == ["10.jsonl.gz", "10.jsonl.gz", "5.jsonl.gz"]
    assert by_count.write(bucket, list(reversed(batch))) == keys  # the same cut on a retry
    read = [m for k in keys for m in by_count.read(k).messages]
    assert sorted(read, key=lambda m: m.message_id) == batch
    by_bytes = S3BucketStore(s3, "x-" + tier_bucket, PREFIX, levels, max_object_bytes=4_000)
    s3.create_bucket(Bucket="x-" + tier_bucket)
    split = by_bytes.write(bucket, batch)
    assert len(split) > 1 and sum(o.count or 0 for o in by_bytes.objects(FINE)) == 25
    assert all(o.size < 4_000 for o in by_bytes.objects(FINE))


def test_write_refuses_two_messages_under_one_id(store: S3BucketStore) -> None:
    one, other = _message(1, NOW), _message(1, NOW, b"other")
    with pytest.raises(InvalidMessageError, match="two different messages"):
        store.write(BucketKey(FINE, NOW), [one, other])


def test_write_due_groups_by_bucket_and_objects_lists_oldest_first(store: S3BucketStore) -> None:
    soon = [_message(n, NOW + timedelta(seconds=3 - n)) for n in range(3)]  # three fine buckets, newest first
    far = [_message(10 + n, NOW + timedelta(seconds=40 + n * 10)) for n in range(2)]  # two coarse buckets
    written = store.write_due(soon + far, NOW)
    assert sorted(written) == list(written)
    assert {b.level for b in written} == {FINE, COARSE} and len(written) == 5
    fine = list(store.objects(FINE))
    assert [o.bucket.start for o in fine] == sorted(o.bucket.start for o in fine) and len(fine) == 3
    assert all(o.count == 1 and o.size > 0 for o in fine)
    until = NOW + timedelta(seconds=2)
    assert [o.bucket.start for o in store.objects(FINE, until=until)] == [NOW + timedelta(seconds=1), until]
    assert [o.bucket.level for o in store.objects(COARSE)] == [COARSE, COARSE]


def test_objects_reads_v1_keys_and_skips_strangers(store: S3BucketStore, s3: Any, tier_bucket: str) -> None:
    key = store.write(BucketKey(FINE, NOW), [_message(1, NOW)])[0]
    v1 = key.replace("-1.jsonl.gz", ".jsonl.gz")
    s3.copy_object(Bucket=tier_bucket, Key=v1, CopySource={"Bucket": tier_bucket, "Key": key})
    s3.put_object(Bucket=tier_bucket, Key=f"{PREFIX}/fine/readme.txt", Body=b"hello")
    listed = {o.key: o.count for o in store.objects(FINE)}
    assert listed == {key: 1, v1: None}
    assert store.read(v1).messages == store.read(key).messages


def test_delete_in_batches_of_a_thousand(store: S3BucketStore, s3: Any) -> None:
    bucket = BucketKey(FINE, NOW)
    keys = [store.write(bucket, [_message(n, NOW)])[0] for n in range(DELETE_BATCH + 5)]
    calls: list[int] = []

    def count(params: dict[str, Any], **_: Any) -> None:
        calls.append(len(params["Delete"]["Objects"]))

    s3.meta.events.register("provide-client-params.s3.DeleteObjects", count)
    store.delete([*keys, "dd/buckets/fine/2031-02-03T04:05:00Z/gone.jsonl.gz"])
    assert calls == [DELETE_BATCH, 6]
    assert list(store.objects(FINE)) == []
    with pytest.raises(ObjectMissingError):
        store.read(keys[0])


def test_missing_bucket_is_one_clear_configuration_error(s3: Any) -> None:
    store = S3BucketStore(s3, "no-such-tier-bucket", PREFIX)
    for action in (
        store.check,
        lambda: store.write(BucketKey(FINE, NOW), [_message(1, NOW)]),
        lambda: list(store.objects(FINE)),
        lambda: store.read(f"{PREFIX}/fine/x"),
        lambda: store.delete(["k"]),
    ):
        with pytest.raises(ConfigurationError, match="'no-such-tier-bucket' does not exist"):
            action()


def test_check_passes_on_an_existing_bucket(store: S3BucketStore) -> None:
    store.check()


def test_from_config_and_error_translation(s3: Any) -> None:
    config = BucketTierConfig("tier-x", prefix="p/q")
    store = S3BucketStore.from_config(s3, config)
    assert (store.bucket_name, store.prefix, store.levels) == ("tier-x", "p/q", config.levels)

    def client_error(code: str, status: int) -> ClientError:
        return ClientError({"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject")

    assert isinstance(translate_s3_error(client_error("SlowDown", 503), "write", "b"), TransientError)
    assert isinstance(translate_s3_error(client_error("InternalError", 500), "write", "b"), TransientError)
    assert isinstance(translate_s3_error(client_error("AccessDenied", 403), "write", "b"), ConfigurationError)
    assert isinstance(translate_s3_error(client_error("NoSuchKey", 404), "read", "b"), ObjectMissingError)
    connection = EndpointConnectionError(endpoint_url="http://x")
    assert isinstance(translate_s3_error(connection, "write", "b"), TransientError)
    with pytest.raises(ConfigurationError):
        S3BucketStore(s3, "b", max_object_messages=0)


def test_open_streams_an_object_and_closes_it(store: S3BucketStore, s3: Any) -> None:
    bucket = BucketKey(FINE, NOW)
    [key] = store.write(bucket, [_message(n, NOW + timedelta(microseconds=n * 400)) for n in range(2_000)])
    stream = store.open(key)
    header = stream.open()
    assert header is not None and header.count == 2_000
    first = next(stream.items())
    assert isinstance(first, BucketMessage)
    del stream  # dropped half read: the body is closed with its generator
    contents = store.read(key)
    assert contents.complete and len(contents.messages) == 2_000
    with pytest.raises(ObjectMissingError):
        store.open(f"{PREFIX}/fine/gone")


def test_a_failure_while_reading_is_the_packages_error(store: S3BucketStore, s3: Any) -> None:
    [key] = store.write(BucketKey(FINE, NOW), [_message(1, NOW)])

    class Broken:
        def read(self, _size: int) -> bytes:
            raise ReadTimeoutError(endpoint_url="http://s3")

        def close(self) -> None:
            closed.append(True)

    closed: list[bool] = []
    stream = BucketStream(store._chunks(key, Broken()))
    with pytest.raises(TransientError, match="read"):
        list(stream.items())
    assert closed == [True]
