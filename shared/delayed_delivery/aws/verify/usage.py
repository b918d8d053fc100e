"""What the probes cost: requests counted in the probe window, priced with the shipped model, beside its estimate.

In an account the counts come from CloudWatch: the probe endpoint's queues (messages sent, received, deleted and
empty receives; each counted as one request, an upper bound when requests carry batches) and its requeue function
(invocations, duration). They lag a few minutes, so the check waits for them. On an emulator every request the
command and its local functions make on the probe endpoint's queues is counted as it leaves the client. The time-
bucket tier's functions serve every endpoint, so their share is not in the window.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from ...cost import FIFO_PRICE_PER_REQUEST, compare_sqs_costs
from ...timebuckets.cost import (
    LAMBDA_PRICE_PER_GB_SECOND,
    LAMBDA_PRICE_PER_INVOCATION,
    S3_GET_PRICE_PER_REQUEST,
    S3_PUT_PRICE_PER_REQUEST,
    STANDARD_PRICE_PER_REQUEST,
    estimate_bucket_cost,
)
from ...verification import CheckResult, Group, passed, skipped, span
from ..sqs import translate_error
from .context import AwsVerifyContext, Usage

__all__ = ["CloudWatchUsage", "RequestTally", "cost_check", "price"]

K = Group.COST
_SQS_METRICS = ("NumberOfMessagesSent", "NumberOfMessagesReceived", "NumberOfMessagesDeleted", "NumberOfEmptyReceives")
_S3_PUTS = {"PutObject", "CopyObject", "ListObjectsV2", "ListObjects", "DeleteObject"}


def price(usage: Usage) -> float:
    """Dollars for ``usage`` at us-east-1 list prices (the ones ``delayed-delivery cost`` uses)."""
    return (
        usage.sqs_standard_requests * STANDARD_PRICE_PER_REQUEST
        + usage.sqs_fifo_requests * FIFO_PRICE_PER_REQUEST
        + usage.lambda_invocations * LAMBDA_PRICE_PER_INVOCATION
        + usage.lambda_gb_seconds * LAMBDA_PRICE_PER_GB_SECOND
        + usage.s3_put_requests * S3_PUT_PRICE_PER_REQUEST
        + usage.s3_get_requests * S3_GET_PRICE_PER_REQUEST
    )


class RequestTally:
    """Counts SQS requests on named queues (standard or FIFO) as they leave boto3 clients (an emulator's meter)."""

    def __init__(self, queues: Sequence[str], lambda_usage: Callable[[], tuple[float, float]] | None = None) -> None:
        self.queues = set(queues)
        self.lambda_usage = lambda_usage or (lambda: (0.0, 0.0))
        self.standard = 0
        self.fifo = 0
        self._lock = threading.Lock()
        self._lambda_start = (0.0, 0.0)

    def attach(self, client: Any) -> Any:
        """Count ``client``'s SQS requests from now on; returns the client."""
        client.meta.events.register("before-parameter-build.sqs.*", self._count)
        return client

    def _count(self, params: dict[str, Any] | None = None, **_: Any) -> None:
        name = str((params or {}).get("QueueUrl", "")).rsplit("/", 1)[-1]
        if name in self.queues:
            with self._lock:
                if name.endswith(".fifo"):
                    self.fifo += 1
                else:
                    self.standard += 1

    def begin(self, now: datetime) -> None:
        """The probe window starts: forget what was counted before."""
        with self._lock:
            self.standard = self.fifo = 0
        self._lambda_start = self.lambda_usage()

    def usage(self, context: AwsVerifyContext) -> Usage | None:
        """What was counted (the UsageMeter port)."""
        invocations, gb_seconds = (a - b for a, b in zip(self.lambda_usage(), self._lambda_start, strict=True))
        with self._lock:
            return Usage(
                self.standard,
                self.fifo,
                invocations,
                gb_seconds,
                source="requests counted at the client; the local event source polls each queue once a second",
            )


class CloudWatchUsage:
    """The probe window's usage from CloudWatch (the UsageMeter port in an account)."""

    def __init__(self, memory_mb: int = 256) -> None:
        self.memory_mb = memory_mb
        self.start: datetime | None = None

    def begin(self, now: datetime) -> None:
        """The probe window starts now."""
        self.start = now

    def _sum(self, ctx: AwsVerifyContext, namespace: str, metric: str, dimension: str, value: str) -> float:
        now = ctx.clock.now()
        start = (self.start or now) - timedelta(minutes=1)
        end = now + timedelta(minutes=1)
        query = {
            "Id": "m",
            "MetricStat": {
                "Metric": {
                    "Namespace": namespace,
                    "MetricName": metric,
                    "Dimensions": [{"Name": dimension, "Value": value}],
                },
                "Period": 60,
                "Stat": "Sum",
            },
        }
        try:
            reply = ctx.clients.cloudwatch.get_metric_data(MetricDataQueries=[query], StartTime=start, EndTime=end)
        except (ClientError, BotoCoreError) as exc:
            raise translate_error(exc, f"reading {namespace} {metric}") from exc
        return float(sum(v for r in reply.get("MetricDataResults", []) for v in r.get("Values", [])))

    def usage(self, ctx: AwsVerifyContext) -> Usage | None:
        """Counts once the input queue shows every probe arrival, else None."""
        probe = ctx.target.probe
        if probe is None:
            return None
        sums = {
            q: sum(self._sum(ctx, "AWS/SQS", m, "QueueName", q) for m in _SQS_METRICS)
            for q in (probe.name, probe.delay_queue, probe.error_queue)
            if q
        }
        if not sums.get(probe.name):
            return None
        invocations = duration_ms = 0.0
        if probe.function.name:
            invocations = self._sum(ctx, "AWS/Lambda", "Invocations", "FunctionName", probe.function.name)
            duration_ms = self._sum(ctx, "AWS/Lambda", "Duration", "FunctionName", probe.function.name)
        fifo = sum(v for q, v in sums.items() if q.endswith(".fifo"))
        return Usage(
            sqs_standard_requests=sum(sums.values()) - fifo,
            sqs_fifo_requests=fifo,
            lambda_invocations=invocations,
            lambda_gb_seconds=duration_ms / 1000 * self.memory_mb / 1024,
            source="CloudWatch (AWS/SQS message counts as requests, AWS/Lambda)",
        )


def _model(kinds: Sequence[tuple[str, float]]) -> float:
    """The shipped model's dollars per message, averaged over the probes' routes and delays (1 KiB messages)."""
    total = 0.0
    for kind, delay in kinds:
        if kind == "tier":
            total += estimate_bucket_cost(delay, 1024).dollars
        elif delay > 900:
            parked = compare_sqs_costs(delay, 1024, 1).parked
            total += parked.dollars if parked is not None else 0.0
        else:
            total += STANDARD_PRICE_PER_REQUEST
    return total / max(1, len(kinds))


def cost_check(ctx: AwsVerifyContext, kinds: Sequence[tuple[str, float]], wait: float) -> CheckResult:
    """Measured dollars per probe message beside the shipped model's; waits up to ``wait`` s for the counts."""
    meter = ctx.usage_meter
    if meter is None or not kinds:
        return skipped("cost", K, "probes", "no probe was sent")
    deadline = ctx.clock.now() + timedelta(seconds=wait)
    usage = meter.usage(ctx)
    while usage is None and ctx.clock.now() < deadline:
        ctx.progress("waiting for CloudWatch to count the probe window (metrics lag a few minutes)")
        ctx.clock.sleep(min(30.0, max(0.0, (deadline - ctx.clock.now()).total_seconds())))
        usage = meter.usage(ctx)
    if usage is None:
        return skipped(
            "cost",
            K,
            "probes",
            f"CloudWatch had not counted the probe window after "
            f"{span(wait)}; --full waits longer (DELAYED_DELIVERY_VERIFY_METRICS_WAIT)",
        )
    dollars = price(usage)
    each, model = dollars / len(kinds), _model(kinds)
    delays = ", ".join(f"{k} {span(d)}" for k, d in kinds)
    requests = usage.sqs_standard_requests + usage.sqs_fifo_requests
    evidence = (
        f"${each:.7f} per message measured ({requests:g} SQS requests, {usage.lambda_invocations:g} Lambda "
        f"invocations, {usage.lambda_gb_seconds:.3f} GB-s for {len(kinds)} message(s): {delays}; {usage.source}); "
        f"the shipped model (`delayed-delivery cost`): ${model:.7f} per message"
    )
    return passed(
        "cost",
        K,
        "probes",
        evidence,
        usd_per_message=each,
        model_usd_per_message=model,
        sqs_requests=requests,
        lambda_invocations=usage.lambda_invocations,
        usd_total=dollars,
    )
