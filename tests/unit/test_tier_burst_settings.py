"""The tier's settings for big buckets: read from the environment, refused naming the variable, partitions sized."""

from __future__ import annotations

import dataclasses

import pytest

from delayed_delivery.aws.tier.config import BucketTierConfig, TierSettings
from delayed_delivery.errors import ConfigurationError
from delayed_delivery.timebuckets.plans import MAX_PARTITIONS


def test_read_from_the_environment_with_the_tier_config() -> None:
    env = {
        "DELAYED_DELIVERY_BUCKET_NAME": "tier-bucket",
        "DELAYED_DELIVERY_BUCKET_DISPATCH_QUEUE": "dd-dispatch",
        "DELAYED_DELIVERY_BUCKET_DISPATCH_CONCURRENCY": "16",
        "DELAYED_DELIVERY_BUCKET_PIECE_BYTES": "1_048_576",
    }
    burst = BucketTierConfig.from_env(env).tier_settings
    assert (burst.bucket_dispatch_queue, burst.bucket_dispatch_concurrency) == ("dd-dispatch", 16)
    assert burst.bucket_piece_bytes == 1_048_576 and TierSettings.from_env({}) == TierSettings()


@pytest.mark.parametrize(
    ("name", "value", "needle"),
    [
        ("DELAYED_DELIVERY_BUCKET_PIECE_BYTES", "12", "BUCKET_PIECE_BYTES\\) must be"),
        ("DELAYED_DELIVERY_BUCKET_DISPATCH_CONCURRENCY", "1001", "DISPATCH_CONCURRENCY\\) must be"),
        ("DELAYED_DELIVERY_BUCKET_SEND_THREADS", "many", "not a whole number"),
        ("DELAYED_DELIVERY_BUCKET_CASCADE_GROUP_BYTES", str(2**40), "CASCADE_GROUP_BYTES\\) must be"),
        ("DELAYED_DELIVERY_BUCKET_DISPATCH_QUEUE", "no spaces allowed", "queue"),
        ("DELAYED_DELIVERY_BUCKET_DISPATCH_QUEUE", "tasks.fifo", "standard queue"),
    ],
)
def test_a_bad_value_is_refused_naming_the_variable(name: str, value: str, needle: str) -> None:
    with pytest.raises(ConfigurationError, match=needle):
        TierSettings.from_env({name: value})


def test_partitions_follow_the_messages_up_to_the_concurrency_then_the_cap() -> None:
    burst = TierSettings(bucket_partition_messages=25_000, bucket_partition_max_messages=100_000,
                          bucket_dispatch_concurrency=8)  # fmt: skip
    assert [burst.partitions(n) for n in (0, 1, 25_000, 25_001, 200_000, 1_000_000, 10**9)] == [
        1, 1, 1, 2, 8, 10, MAX_PARTITIONS,
    ]  # fmt: skip


def test_the_reference_names_every_setting() -> None:
    table = TierSettings.markdown_reference()
    assert table.count("\n| bucket_") == len(dataclasses.fields(TierSettings)) == 14
    assert "`DELAYED_DELIVERY_BUCKET_DISPATCH_QUEUE`" in table
