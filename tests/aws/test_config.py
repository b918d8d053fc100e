"""``AwsConfig.from_env``: every setting of the requeue function, read in one place."""

from __future__ import annotations

import pytest

from delayed_delivery.aws.config import AwsConfig
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.errors import ConfigurationError


def test_defaults_when_nothing_is_set() -> None:
    config = AwsConfig.from_env({})
    assert config == AwsConfig()
    assert (config.sqs_settings.pack_bytes, config.cancellation_table, config.cancellation_cache_seconds) == (
        65536,
        None,
        60,
    )
    assert (config.service, config.metrics_namespace) == ("delayed-delivery-requeue", "DelayedDelivery")
    assert config.settings.enabled and config.sqs_settings.fifo_queue_delay == 900


def test_every_variable_is_read() -> None:
    config = AwsConfig.from_env(
        {
            "DELAYED_DELIVERY_FIFO_QUEUE_DELAY": "2",
            "DELAYED_DELIVERY_ENABLED": "false",
            "DELAYED_DELIVERY_PACK_BYTES": " 0 ",
            "DELAYED_DELIVERY_CANCELLATION_TABLE": " records ",
            "DELAYED_DELIVERY_CANCELLATION_CACHE_SECONDS": "1.5",
            "POWERTOOLS_SERVICE_NAME": "requeue-orders",
            "POWERTOOLS_METRICS_NAMESPACE": "Orders",
        }
    )
    assert config.sqs_settings.fifo_queue_delay == 2 and not config.settings.enabled
    assert (config.sqs_settings.pack_bytes, config.cancellation_table, config.cancellation_cache_seconds) == (
        0,
        "records",
        1.5,
    )
    assert (config.service, config.metrics_namespace) == ("requeue-orders", "Orders")
    assert AwsConfig.from_env({"DELAYED_DELIVERY_CANCELLATION_TABLE": "  "}).cancellation_table is None


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DELAYED_DELIVERY_PACK_BYTES", "-1"),
        ("DELAYED_DELIVERY_PACK_BYTES", "64k"),
        ("DELAYED_DELIVERY_CANCELLATION_CACHE_SECONDS", "601"),
        ("DELAYED_DELIVERY_CANCELLATION_CACHE_SECONDS", "nan"),
        ("DELAYED_DELIVERY_FIFO_QUEUE_DELAY", "soon"),
    ],
)
def test_a_malformed_value_names_its_variable(name: str, value: str) -> None:
    with pytest.raises(ConfigurationError, match=name):
        AwsConfig.from_env({name: value})


def test_direct_construction_is_checked_too() -> None:
    with pytest.raises(ConfigurationError, match="DELAYED_DELIVERY_PACK_BYTES"):
        SqsSettings(pack_bytes=-1)
    with pytest.raises(ConfigurationError, match="CACHE_SECONDS"):
        AwsConfig(cancellation_cache_seconds=900)
