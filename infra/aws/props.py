"""Typed properties the stack hands to its constructs: what every endpoint shares, and the tier's own options."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_

from delayed_delivery.aws.config import DEFAULT_CACHE_SECONDS
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.aws.tier.config import DEFAULT_PREFIX, INGEST_WINDOW_SECONDS, TierSettings
from delayed_delivery.planning import MAX_PARK_SECONDS
from delayed_delivery.release import ReleaseRates

__all__ = ["OVERDUE_THRESHOLD_SECONDS", "RELEASE_LAG_ALARM_SECONDS", "SharedProps", "TierOptions"]

#: The release-lag alarm fires when release control held a message back longer than this (seconds).
RELEASE_LAG_ALARM_SECONDS = 300
#: A fine bucket still holding objects this long after its end raises the tier's overdue alarm.
OVERDUE_THRESHOLD_SECONDS = 120
_SQS = SqsSettings()
_TIMING = TierSettings()


@dataclass(frozen=True)
class SharedProps:
    """What the endpoints, the probe and the tier of one stack share: code, tables, key, settings, alarm actions."""

    code: lambda_.Code
    layers: Sequence[lambda_.ILayerVersion] = ()
    max_native_delay: int = _SQS.max_native_delay
    fifo_queue_delay: int = _SQS.fifo_queue_delay
    max_park_seconds: int = MAX_PARK_SECONDS
    park_max_in_flight: int = _SQS.park_max_in_flight
    alarm_actions: Sequence[cloudwatch.IAlarmAction] = ()
    cancellation_table: dynamodb.ITable | None = None
    cancellation_cache_seconds: int = DEFAULT_CACHE_SECONDS
    encryption_key: kms.IKey | None = None
    release_rates: ReleaseRates = field(default_factory=ReleaseRates)
    release_table: dynamodb.ITable | None = None
    release_lag_alarm_seconds: int = RELEASE_LAG_ALARM_SECONDS


@dataclass(frozen=True)
class TierOptions:
    """The time-bucket tier's own options (context ``bucket*`` keys); the defaults are the settings' defaults."""

    prefix: str = DEFAULT_PREFIX
    ingest_queue_name: str = _SQS.bucket_ingest_queue
    bucket_name: str | None = None
    fine_seconds: int = _TIMING.bucket_fine_seconds
    coarse_seconds: int = _TIMING.bucket_coarse_seconds
    dispatch_lead_seconds: int = _TIMING.bucket_dispatch_lead_seconds
    refused_retry_seconds: int = _TIMING.bucket_refused_retry_seconds
    overdue_threshold_seconds: int = OVERDUE_THRESHOLD_SECONDS
    ingest_window_seconds: int = INGEST_WINDOW_SECONDS
    dispatch_concurrency: int = _TIMING.bucket_dispatch_concurrency

    @classmethod
    def of(cls, options: TierOptions | Mapping[str, Any] | None) -> TierOptions:
        """``options`` as given, or from a mapping of option names (``ValueError`` names an unknown one)."""
        if isinstance(options, TierOptions):
            return options
        given = dict(options or {})
        unknown = sorted(set(given) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"unknown time-bucket tier options: {', '.join(unknown)}")
        return cls(**given)
