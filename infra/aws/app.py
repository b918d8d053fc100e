#!/usr/bin/env python3
"""CDK app: ``cd infra/aws && npx cdk synth`` (or deploy). Configuration is CDK context (cdk.json or ``-c``).

cdk.json runs it as the module ``infra.aws.app`` with the repository root on ``PYTHONPATH``.

Context keys: ``endpoints`` (list of queue names or ``{"name", "existingQueueArn", "existingQueueKeyArn",
"senders"}``), ``stackName``, ``powertoolsLayerVersion``, ``maxNativeDelay``, ``fifoQueueDelay``, ``alarmTopicArn``,
``cancellationTable``, ``cancellationCacheSeconds``, ``maxParkSeconds`` (0 turns parking off), ``parkMaxInFlight``,
``kmsKey`` (``"create"`` or a key ARN; absent = SQS-managed encryption), ``delaySenders`` (role ARNs, ``*`` patterns
allowed, that may send to every ``-delay.fifo``; each endpoint's ``senders`` add to it), ``exampleConsumer`` (true adds
the example consumer, ``functions/aws/consumer.py``, on each endpoint's input queue), ``longDelayRoute`` (``auto``,
the default, and ``buckets`` deploy the S3 time-bucket tier, ``fifo`` does not) with ``bucketName``, ``bucketPrefix``,
``bucketIngestQueue``, ``bucketFineSeconds``, ``bucketCoarseSeconds``, ``bucketDispatchLeadSeconds``,
``bucketIngestWindowSeconds`` (the ingest's batching window, 0-300, default 300), ``bucketRefusedRetrySeconds``;
``verifyProbe``
(true, the default, adds the probe endpoint ``delayed-delivery aws verify`` uses: zero idle cost) and ``verifyRoles``
(role ARNs that run verify: they may send to the probe's ``-delay.fifo`` and the tier's ingest queue);
``releaseRates`` (release control: a JSON object of queue name to the most messages per second released to it,
``"*"`` the default, e.g. ``{"orders": 200, "*": 1000}``; it adds the ``ReleaseSlots`` table), ``releaseTable`` and
``releaseLagAlarmSeconds`` (the ``ReleaseLagHigh`` alarm's threshold, default 300); ``recurringSchedules`` (true
adds the schedules table and the every-minute schedule timer, docs/schedules.md) with ``scheduleTable`` and
``scheduleLeadSeconds``.
cdk-nag's AwsSolutions checks run on every synth; an unsuppressed finding fails it.
"""

from __future__ import annotations

import json
from typing import Any

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks

from delayed_delivery.aws.config import DEFAULT_CACHE_SECONDS
from delayed_delivery.aws.release_calendar import DEFAULT_RELEASE_TABLE
from delayed_delivery.planning import MAX_PARK_SECONDS
from delayed_delivery.release import ReleaseRates
from infra.aws.props import RELEASE_LAG_ALARM_SECONDS, TierOptions
from infra.aws.stack import DEFAULT_CANCELLATION_TABLE, DEFAULT_SQS, DelayedDeliveryStack, EndpointConfig


def _context(app: cdk.App, key: str, default: Any) -> Any:
    value = app.node.try_get_context(key)
    if isinstance(value, str) and value[:1] in "[{":
        value = json.loads(value)  # -c endpoints='["a","b"]'
    return default if value is None else value


def _senders(value: Any, key: str = "delaySenders") -> list[str]:
    """A list of role ARNs, or one comma-separated string (``-c delaySenders=arn1,arn2``)."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise ValueError(f"context '{key}' is a list of role ARNs")
    return [i.strip() for i in items if i.strip()]


def _flag(value: Any, key: str = "exampleConsumer") -> bool:
    """A boolean context value: JSON true/false, or ``-c exampleConsumer=true`` (a string)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ValueError(f"context '{key}' is true or false, not {value!r}")


def _release_rates(value: Any) -> ReleaseRates:
    """Context ``releaseRates``: a JSON object (``-c releaseRates='{"orders": 200}'``); ValueError names a bad entry."""
    if value is None:
        return ReleaseRates()
    try:
        return ReleaseRates.of(value)
    except ValueError as exc:
        raise ValueError(f"context 'releaseRates': {exc}") from None


#: Context keys of the time-bucket tier -> ``TierOptions`` fields (and how to read them).
_TIER_CONTEXT: dict[str, tuple[str, type]] = {
    "bucketName": ("bucket_name", str),
    "bucketPrefix": ("prefix", str),
    "bucketIngestQueue": ("ingest_queue_name", str),
    "bucketFineSeconds": ("fine_seconds", int),
    "bucketCoarseSeconds": ("coarse_seconds", int),
    "bucketDispatchLeadSeconds": ("dispatch_lead_seconds", int),
    "bucketIngestWindowSeconds": ("ingest_window_seconds", int),
    "bucketRefusedRetrySeconds": ("refused_retry_seconds", int),
    "bucketDispatchConcurrency": ("dispatch_concurrency", int),
}


def _bucket_tier(app: cdk.App) -> TierOptions:
    """The tier's options given in context (the construct's defaults for the rest)."""
    found = {key: _context(app, key, None) for key in _TIER_CONTEXT}
    return TierOptions.of({_TIER_CONTEXT[k][0]: _TIER_CONTEXT[k][1](v) for k, v in found.items() if v is not None})


def _schedules(app: cdk.App) -> dict[str, Any] | None:
    """Context ``recurringSchedules`` (true deploys them), ``scheduleTable``, ``scheduleLeadSeconds``."""
    if not _flag(_context(app, "recurringSchedules", False), "recurringSchedules"):
        return None
    options: dict[str, Any] = {}
    if _context(app, "scheduleTable", None) is not None:
        options["table_name"] = str(_context(app, "scheduleTable", None))
    if _context(app, "scheduleLeadSeconds", None) is not None:
        options["lead_seconds"] = int(_context(app, "scheduleLeadSeconds", None))
    return options


def build(app: cdk.App) -> DelayedDeliveryStack:
    """Instantiate the stack from the app's context."""
    raw = _context(app, "endpoints", ["orders"])
    endpoints = [EndpointConfig.parse(e) for e in (raw.split(",") if isinstance(raw, str) else raw)]
    stack = DelayedDeliveryStack(
        app,
        str(_context(app, "stackName", "DelayedDelivery")),
        endpoints=endpoints,
        powertools_layer_version=str(_context(app, "powertoolsLayerVersion", "27")),
        max_native_delay=int(_context(app, "maxNativeDelay", DEFAULT_SQS.max_native_delay)),
        fifo_queue_delay=int(_context(app, "fifoQueueDelay", DEFAULT_SQS.fifo_queue_delay)),
        alarm_topic_arn=_context(app, "alarmTopicArn", None),
        cancellation_table_name=str(_context(app, "cancellationTable", DEFAULT_CANCELLATION_TABLE)),
        cancellation_cache_seconds=int(_context(app, "cancellationCacheSeconds", DEFAULT_CACHE_SECONDS)),
        max_park_seconds=int(_context(app, "maxParkSeconds", MAX_PARK_SECONDS)),
        park_max_in_flight=int(_context(app, "parkMaxInFlight", DEFAULT_SQS.park_max_in_flight)),
        kms_key=_context(app, "kmsKey", None),
        senders=_senders(_context(app, "delaySenders", [])),
        example_consumer=_flag(_context(app, "exampleConsumer", False)),
        long_delay_route=str(_context(app, "longDelayRoute", DEFAULT_SQS.long_delay_route)),
        bucket_tier=_bucket_tier(app),
        verify_probe=_flag(_context(app, "verifyProbe", True), "verifyProbe"),
        verify_roles=_senders(_context(app, "verifyRoles", []), "verifyRoles"),
        release_rates=_release_rates(_context(app, "releaseRates", None)),
        release_table_name=str(_context(app, "releaseTable", DEFAULT_RELEASE_TABLE)),
        release_lag_alarm_seconds=int(_context(app, "releaseLagAlarmSeconds", RELEASE_LAG_ALARM_SECONDS)),
        recurring_schedules=_schedules(app),
        description="Unrestricted SQS delayed delivery (delayed-delivery)",
    )
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app, verbose=True))
    return stack


if __name__ == "__main__":
    application = cdk.App()
    build(application)
    application.synth()
