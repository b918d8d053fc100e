"""``TimeBucketTier``: the S3 time-bucket tier for long SQS delays, as a reusable construct (docs/buckets.md).

It creates the S3 bucket of bucket objects, the standard ingest queue (with its DLQ) that senders hand long delays
to, the tier's error queue, the ingest function (SQS event source, big batches), the timer function (every
minute, one at a time), the dispatch queue (with its DLQ) and the dispatch function that sends big buckets in
pieces (``dispatch_concurrency`` at once), least-privilege IAM scoped to the prefix, queues and table, alarms and
dashboard widgets.
Deployment is described in docs/aws.md ("Deploying the time-bucket tier").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jsii
from aws_cdk import Acknowledgment, Duration, IStableListProducer, Lazy, RemovalPolicy, Stack, Validations
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sqs as sqs
from aws_cdk.aws_lambda_event_sources import SqsEventSource
from constructs import Construct

from delayed_delivery.aws.config import CACHE_SECONDS_ENV, RELEASE_TABLE_ENV, TABLE_ENV
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.aws.tier.config import (
    BUCKET_NAME_ENV,
    BUCKET_PREFIX_ENV,
    DEFAULT_PREFIX,
    DEFAULT_SERVICE,
    DESTINATIONS_ENV,
    INGEST_TIMEOUT_SECONDS,
    TierSettings,
    check_ingest_wait,
)
from delayed_delivery.naming import FIFO_SUFFIX, validate_sqs_queue_name
from delayed_delivery.release import RELEASE_RATES_ENV
from delayed_delivery.settings import DelayedDeliverySettings
from infra.aws.alarms import Alert, add_alarms, product_metric
from infra.aws.functions import (
    PowertoolsFunction,
    powertools_function,
    setting_env,
    settings_env,
)
from infra.aws.props import OVERDUE_THRESHOLD_SECONDS, SharedProps, TierOptions

__all__ = [
    "DEFAULT_DISPATCH_CONCURRENCY",
    "DEFAULT_INGEST_QUEUE",
    "DEFAULT_PREFIX",
    "DISPATCH_HANDLER",
    "INGEST_HANDLER",
    "OVERDUE_THRESHOLD_SECONDS",
    "SERVICE",
    "TIMER_HANDLER",
    "TimeBucketTier",
]

#: The ingest function's handler, by dotted name (infra never imports function code).
INGEST_HANDLER = "functions.aws.bucket_ingest.handler"
#: The timer function's handler.
TIMER_HANDLER = "functions.aws.bucket_timer.handler"
#: The dispatch function's handler (the workers that send big buckets in pieces).
DISPATCH_HANDLER = "functions.aws.bucket_dispatch.handler"
#: Dispatch workers at once (the event source's MaximumConcurrency: 2 to 1,000).
DEFAULT_DISPATCH_CONCURRENCY = TierSettings().bucket_dispatch_concurrency
#: A dispatch worker's invocation: it records its progress and hands its task on before the end.
DISPATCH_TIMEOUT = Duration.minutes(3)
#: Memory of a dispatch worker: one full vCPU (its work is CPU-bound, so GB-seconds cost the same as with less);
#: each run peaks well under 128 MiB of its own (benchmarks/aws.md).
DISPATCH_MEMORY_MB = 1769
#: Receives of a dispatch task before it goes to the dispatch DLQ.
DISPATCH_MAX_RECEIVES = 5
#: The oldest dispatch task waiting this long means the workers fall behind (or none runs).
DISPATCH_AGE_THRESHOLD_SECONDS = 300
#: Powertools service of both functions (the ``service`` dimension of their metrics).
SERVICE = DEFAULT_SERVICE
#: The tier's timing when none is given: the functions' own defaults.
DEFAULT_TIMING = TierSettings()
#: The ingest queue (``DELAYED_DELIVERY_BUCKET_INGEST_QUEUE``'s default).
DEFAULT_INGEST_QUEUE = SqsSettings().bucket_ingest_queue
#: Ingest batching: up to this many records (or 6 MB), gathered for up to ``ingest_window_seconds`` (300 s by
#: default): at low traffic an invocation's objects hold a few minutes of messages (fewer, bigger objects).
INGEST_BATCH_SIZE = 1_000
INGEST_TIMEOUT = Duration.seconds(INGEST_TIMEOUT_SECONDS)
TIMER_TIMEOUT = Duration.minutes(5)
#: Receives before an ingest record goes to the DLQ.
INGEST_MAX_RECEIVES = 5
#: The ingest queue's dead-letter queue is named after it with this suffix.
INGEST_DLQ_SUFFIX = "-dlq"
RETENTION = Duration.days(14)


def _check(
    prefix: str, levels: tuple[int, int, int], ingest_queue_name: str, max_native_delay: int, window: int
) -> None:
    """``ValueError`` for a prefix, bucket sizes or an ingest queue the functions would refuse at start, or a batching
    window a message routed to the tier could sit in past its bucket's first dispatch."""
    if not prefix or prefix.startswith("/") or prefix.endswith("/") or "*" in prefix:
        raise ValueError(f"bucket prefix {prefix!r}: path segments without a slash at either end")
    timing = DEFAULT_TIMING.with_(  # ConfigurationError (a ValueError) with the functions' own words
        bucket_fine_seconds=levels[0], bucket_coarse_seconds=levels[1], bucket_dispatch_lead_seconds=levels[2]
    )
    check_ingest_wait(timing.levels, max_native_delay, window, INGEST_TIMEOUT_SECONDS)
    if ingest_queue_name.endswith(FIFO_SUFFIX):
        raise ValueError(f"ingest queue {ingest_queue_name!r}: a standard queue, not a FIFO one")
    validate_sqs_queue_name(f"{ingest_queue_name}{INGEST_DLQ_SUFFIX}")  # the name and its DLQ's


@jsii.implements(IStableListProducer)
class _Arns:
    """The principal ARNs allowed to send to the ingest queue, read when the template is written."""

    def __init__(self) -> None:
        self.arns: list[str] = []

    def produce(self) -> list[str]:
        """The ARNs granted so far."""
        return list(self.arns)


def _grant_send(queue: sqs.IQueue, grantee: iam.IGrantable) -> None:
    """Send to ``queue`` (found by name), with the two key actions SQS needs when it is encrypted with a key."""
    queue.grant(grantee, "sqs:SendMessage", "sqs:GetQueueAttributes", "sqs:GetQueueUrl")
    if queue.encryption_master_key is not None:
        queue.encryption_master_key.grant(grantee, "kms:GenerateDataKey", "kms:Decrypt")


class TimeBucketTier(Construct):
    """S3 bucket, ingest queue and DLQ, error queue, ingest and timer functions, IAM, alarms for the tier."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        shared: SharedProps,
        destinations: Mapping[str, sqs.IQueue],
        sender_arns: Sequence[str] = (),
        options: TierOptions | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        opts = options or TierOptions()
        levels = (opts.fine_seconds, opts.coarse_seconds, opts.dispatch_lead_seconds)
        max_native_delay, prefix, ingest_queue_name = shared.max_native_delay, opts.prefix, opts.ingest_queue_name
        _check(prefix, levels, ingest_queue_name, max_native_delay, opts.ingest_window_seconds)
        concurrency = opts.dispatch_concurrency
        if not isinstance(concurrency, int) or not 2 <= concurrency <= 1_000:
            raise ValueError(f"dispatch_concurrency {concurrency!r}: 2 to 1,000 (the event source's limits)")
        self.ingest_window = Duration.seconds(opts.ingest_window_seconds)
        #: How long an ingest record may wait before a message routed at the shortest long delay misses its
        #: bucket's first dispatch (the IngestFallingBehind alarm's threshold).
        timing = TierSettings(*levels, bucket_refused_retry_seconds=opts.refused_retry_seconds)
        self.ingest_slack_seconds = timing.levels.ingest_slack(max_native_delay)
        if not destinations:
            raise ValueError("the time-bucket tier needs at least one destination queue")
        self.prefix = prefix
        self.encryption_key = shared.encryption_key
        self.destinations = dict(destinations)
        self.bucket = self._bucket(opts.bucket_name)
        self._queues(ingest_queue_name)
        self._dispatch_queues()
        self._senders = _Arns()
        sqs_settings = SqsSettings(max_native_delay=max_native_delay, bucket_ingest_queue=ingest_queue_name)
        environment = {
            BUCKET_NAME_ENV: self.bucket.bucket_name,
            BUCKET_PREFIX_ENV: prefix,
            setting_env(DelayedDeliverySettings, "error_queue"): self.error_queue.queue_name,
            **settings_env(sqs_settings, "bucket_ingest_queue", "max_native_delay"),
            **settings_env(timing, "bucket_fine_seconds", "bucket_coarse_seconds", "bucket_dispatch_lead_seconds"),
            **settings_env(timing, "bucket_refused_retry_seconds"),
            # The queues the tier may deliver to: an ingest record naming another is refused (docs/buckets.md).
            DESTINATIONS_ENV: ",".join(sorted(self.destinations)),
            setting_env(TierSettings, "bucket_dispatch_queue"): self.dispatch_queue.queue_name,
            **settings_env(timing.with_(bucket_dispatch_concurrency=concurrency), "bucket_dispatch_concurrency"),
        }
        cancellation_table, release_table = shared.cancellation_table, shared.release_table
        if cancellation_table is not None:
            environment[TABLE_ENV] = cancellation_table.table_name
            environment[CACHE_SECONDS_ENV] = str(shared.cancellation_cache_seconds)
        #: Release control: the timer and the workers take capped destinations' slots from the release table.
        self.release_rates = shared.release_rates
        if self.release_rates:
            if release_table is None:
                raise ValueError("release_rates caps destinations: the tier takes their slots from release_table")
            environment[RELEASE_RATES_ENV] = self.release_rates.to_json()
            environment[RELEASE_TABLE_ENV] = release_table.table_name
        self._refused_retry = opts.refused_retry_seconds
        self._release_lag_seconds = shared.release_lag_alarm_seconds
        self.ingest = self._ingest(shared.code, shared.layers, environment)
        self.timer = self._timer(shared.code, shared.layers, environment, cancellation_table)
        self.dispatch = self._dispatch(shared.code, shared.layers, environment, cancellation_table, concurrency)
        if self.release_rates and release_table is not None:
            for made in (self.timer, self.dispatch):
                made.role.add_to_policy(
                    iam.PolicyStatement(
                        actions=["dynamodb:UpdateItem", "dynamodb:GetItem", "dynamodb:Query"],
                        resources=[release_table.table_arn],
                        conditions={"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": sorted(self.destinations)}},
                    )
                )
        # Secure by default: only the tier's own roles, the senders named here and those granted later may send.
        self._senders.arns.extend([self.ingest.role.role_arn, self.timer.role.role_arn, *sender_arns])
        self._restrict_senders()
        self.alarms = self._alarms(opts.overdue_threshold_seconds, shared.alarm_actions)
        self._suppress()
        for made in (self.ingest, self.timer, self.dispatch):
            self._acknowledge_prefix(made.role)

    def grant_send_ingest(self, grantee: iam.IGrantable) -> None:
        """Let ``grantee`` (a role, or a function or task running as one) hand messages to the ingest queue."""
        arn = getattr(grantee.grant_principal, "role_arn", None)
        if not isinstance(arn, str):
            raise TypeError("an ingest sender is a role, or runs as one (a function, a task): its ARN is the condition")
        self._senders.arns.append(arn)
        _grant_send(self.ingest_queue, grantee)

    def _restrict_senders(self) -> None:
        """Deny ``SendMessage`` on the ingest queue to every principal but the tier's roles and the named senders.

        An ingest record decides a message's destination, due time and first send time (which cancel records bind
        to), so with no sender named the queue is closed to everyone else in the account too.
        """
        self.ingest_queue.add_to_resource_policy(
            iam.PolicyStatement(
                sid="OnlyGrantedSendersMayIngest",
                effect=iam.Effect.DENY,
                principals=[iam.AnyPrincipal()],
                actions=["sqs:SendMessage"],
                resources=[self.ingest_queue.queue_arn],
                conditions={"ArnNotLike": {"aws:PrincipalArn": Lazy.list(self._senders)}},
            )
        )

    def _bucket(self, bucket_name: str | None) -> s3.Bucket:
        """Private, encrypted, TLS-only, unversioned; debris expires, the bucket outlives the stack."""
        encryption: dict[str, Any] = (
            {"encryption": s3.BucketEncryption.S3_MANAGED}
            if self.encryption_key is None
            else {
                "encryption": s3.BucketEncryption.KMS,
                "encryption_key": self.encryption_key,
                "bucket_key_enabled": True,
            }
        )
        return s3.Bucket(
            self,
            "Objects",
            bucket_name=bucket_name,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            versioned=False,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            lifecycle_rules=[
                s3.LifecycleRule(id="AbortIncompleteUploads", abort_incomplete_multipart_upload_after=Duration.days(1)),
                s3.LifecycleRule(id="ExpireLeases", prefix=f"{self.prefix}/leases/", expiration=Duration.days(2)),
                # A plan is deleted once sent; one left by a run killed in its clean-up goes after a week.
                s3.LifecycleRule(id="ExpirePlans", prefix=f"{self.prefix}/plans/", expiration=Duration.days(7)),
            ],
            removal_policy=RemovalPolicy.RETAIN,  # messages wait here for years
            **encryption,
        )

    def _queue_encryption(self) -> dict[str, Any]:
        if self.encryption_key is None:
            return {"encryption": sqs.QueueEncryption.SQS_MANAGED}
        return {"encryption": sqs.QueueEncryption.KMS, "encryption_master_key": self.encryption_key}

    def _queues(self, ingest_queue_name: str) -> None:
        """The ingest queue (standard) with its DLQ, and the tier's error queue: encrypted, TLS-only, 14 days."""
        common: dict[str, Any] = {"retention_period": RETENTION, "enforce_ssl": True, **self._queue_encryption()}
        self.ingest_dlq = sqs.Queue(self, "IngestDlq", queue_name=f"{ingest_queue_name}{INGEST_DLQ_SUFFIX}", **common)
        # Lambda advises a visibility of 6x the function timeout plus the batching window.
        visibility = INGEST_TIMEOUT.to_seconds() * 6 + self.ingest_window.to_seconds()
        self.ingest_queue = sqs.Queue(
            self,
            "Ingest",
            queue_name=ingest_queue_name,
            visibility_timeout=Duration.seconds(visibility),
            dead_letter_queue=sqs.DeadLetterQueue(queue=self.ingest_dlq, max_receive_count=INGEST_MAX_RECEIVES),
            **common,
        )
        self.error_queue = sqs.Queue(self, "Errors", **common)

    def _dispatch_queues(self) -> None:
        """The dispatch queue of tasks (standard, encrypted, TLS-only) with its DLQ; tasks live 4 days."""
        common: dict[str, Any] = {"enforce_ssl": True, **self._queue_encryption()}
        self.dispatch_dlq = sqs.Queue(self, "DispatchDlq", retention_period=RETENTION, **common)
        self.dispatch_queue = sqs.Queue(
            self,
            "Dispatch",
            retention_period=Duration.days(4),
            visibility_timeout=Duration.seconds(DISPATCH_TIMEOUT.to_seconds() * 2),
            dead_letter_queue=sqs.DeadLetterQueue(queue=self.dispatch_dlq, max_receive_count=DISPATCH_MAX_RECEIVES),
            **common,
        )

    def _ingest(
        self, code: lambda_.Code, layers: Sequence[lambda_.ILayerVersion], env: dict[str, str]
    ) -> PowertoolsFunction:
        """Ingest: big SQS batches into one object per bucket; may only write objects under the prefix."""
        made = powertools_function(
            Construct(self, "IngestFunction"),
            "Function",
            handler=INGEST_HANDLER,
            code=code,
            layers=layers,
            timeout=INGEST_TIMEOUT,
            memory_size=512,
            service=SERVICE,
            description="Writes bucket-routed messages from the ingest queue into S3 bucket objects",
            role_description="Time-bucket ingest: its queue, PutObject under the prefix, the error queue, its logs",
            environment=env,
        )
        made.function.add_event_source(
            SqsEventSource(
                self.ingest_queue,
                batch_size=INGEST_BATCH_SIZE,
                max_batching_window=self.ingest_window,
                report_batch_item_failures=True,
            )
        )
        made.role.add_to_policy(iam.PolicyStatement(actions=["s3:PutObject"], resources=[self._objects_arn()]))
        if self.bucket.encryption_key is not None:
            self.bucket.encryption_key.grant(made.role, "kms:GenerateDataKey", "kms:Decrypt")
        _grant_send(self.error_queue, made.role)
        return made

    def _objects_arn(self) -> str:
        return self.bucket.arn_for_objects(f"{self.prefix}/*")

    def _timer(
        self,
        code: lambda_.Code,
        layers: Sequence[lambda_.ILayerVersion],
        env: dict[str, str],
        table: dynamodb.ITable | None,
    ) -> PowertoolsFunction:
        """Timer: every minute, one at a time; lists, reads, writes and deletes under the prefix, sends on."""
        made = powertools_function(
            Construct(self, "TimerFunction"),
            "Function",
            handler=TIMER_HANDLER,
            code=code,
            layers=layers,
            timeout=TIMER_TIMEOUT,
            memory_size=512,
            reserved_concurrent_executions=1,
            service=SERVICE,
            description="Cascades coarse time buckets into fine ones and dispatches due fine buckets (every minute)",
            role_description="Time-bucket timer: objects under the prefix, sends to the destinations and the error "
            "queue, its endpoints' cancellation records, its logs",
            environment=env,
        )
        self._grant_dispatching(made.role, table)
        # A tick that cannot run (the one allowed instance is busy) is dropped, not retried: the next comes anyway.
        events.Rule(
            self,
            "EveryMinute",
            description="Runs the time-bucket timer every minute",
            schedule=events.Schedule.rate(Duration.minutes(1)),
            targets=[targets.LambdaFunction(made.function, retry_attempts=0, max_event_age=Duration.minutes(1))],
        )
        return made

    def _grant_dispatching(self, role: iam.Role, table: dynamodb.ITable | None) -> None:
        """What the timer and the dispatch workers both do: objects under the prefix, sends, tasks, records."""
        role.add_to_policy(
            iam.PolicyStatement(
                actions=["s3:ListBucket"],
                resources=[self.bucket.bucket_arn],
                conditions={"StringLike": {"s3:prefix": [f"{self.prefix}/*"]}},
            )
        )
        role.add_to_policy(
            iam.PolicyStatement(
                actions=["s3:GetObject", "s3:PutObject", "s3:DeleteObject"], resources=[self._objects_arn()]
            )
        )
        if self.bucket.encryption_key is not None:
            self.bucket.encryption_key.grant(role, "kms:GenerateDataKey", "kms:Decrypt")
        for queue in (*self.destinations.values(), self.error_queue, self.dispatch_queue):
            _grant_send(queue, role)
        if table is not None:
            role.add_to_policy(
                iam.PolicyStatement(
                    actions=["dynamodb:Query", "dynamodb:DeleteItem"],
                    resources=[table.table_arn],
                    conditions={"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": sorted(self.destinations)}},
                )
            )

    def _dispatch(
        self,
        code: lambda_.Code,
        layers: Sequence[lambda_.ILayerVersion],
        env: dict[str, str],
        table: dynamodb.ITable | None,
        concurrency: int,
    ) -> PowertoolsFunction:
        """Dispatch workers: one task (a partition of a planned bucket) per invocation, ``concurrency`` at once."""
        made = powertools_function(
            Construct(self, "DispatchFunction"),
            "Function",
            handler=DISPATCH_HANDLER,
            code=code,
            layers=layers,
            timeout=DISPATCH_TIMEOUT,
            memory_size=DISPATCH_MEMORY_MB,
            service=SERVICE,
            description="Sends the partitions of big time buckets in pieces (dispatch tasks from the timer)",
            role_description="Time-bucket dispatch: objects under the prefix, sends to the destinations, the error "
            "and dispatch queues, its endpoints' cancellation records, its logs",
            environment=env,
        )
        made.function.add_event_source(
            SqsEventSource(
                self.dispatch_queue, batch_size=1, report_batch_item_failures=True, max_concurrency=concurrency
            )
        )
        self._grant_dispatching(made.role, table)
        return made

    def _metric(self, name: str, statistic: str = "Sum") -> cloudwatch.Metric:
        """One of the tier functions' own EMF metrics, per minute."""
        return product_metric(name, SERVICE, statistic)

    def _alarms(self, overdue_seconds: int, actions: Sequence[cloudwatch.IAlarmAction]) -> list[cloudwatch.Alarm]:
        """Overdue buckets, ingest age, the DLQ and error queue not empty, either function failing."""
        minute = {"period": Duration.minutes(1), "statistic": "Maximum"}
        age = self.ingest_slack_seconds
        alerts = [
            Alert(
                "BucketOverdue",
                f"A fine time bucket still held messages over {overdue_seconds} s after its end: the timer is not "
                "dispatching (failing, throttled, or behind)",
                self._metric("BucketOldestOverdueSeconds", "Maximum"),
                threshold=overdue_seconds,
                strictly=True,
            ),
            Alert(
                "IngestFallingBehind",
                f"The oldest ingest message waited over {age} s for 5 minutes: long delays are not reaching S3 in "
                "time for their bucket's first dispatch (the shortest ones go out a timer run later, or late)",
                self.ingest_queue.metric_approximate_age_of_oldest_message(**minute),
                threshold=age,
                periods=5,
                strictly=True,
            ),
            Alert(
                "IngestDlqNotEmpty",
                f"Ingest records failed {INGEST_MAX_RECEIVES} times and reached the ingest DLQ (redrive them once "
                "the cause is fixed)",
                self.ingest_dlq.metric_approximate_number_of_messages_visible(**minute),
                threshold=0,
                strictly=True,
            ),
            Alert(
                "ErrorQueueNotEmpty",
                "Bucket-routed messages reached the tier's error queue",
                self.error_queue.metric_approximate_number_of_messages_visible(**minute),
            ),
            Alert(
                "TimerFailing",
                "Timer runs failed three minutes running (BucketTimerFailures: the function catches these, so its "
                "Errors metric does not count them); look for 'timer run failed' in its logs",
                self._metric("BucketTimerFailures"),
                periods=3,
            ),
            Alert(
                "DestinationRefused",
                "A destination refused the tier's sends (the timer's or a dispatch worker's: access denied, or a KMS "
                "key it may not use): its messages are written back, outside any plan, and tried again every run "
                f"until {self._refused_retry} s past their due time, then go to the tier's error queue with the "
                "reason (BucketRefusedToErrorQueue); fix the destination's access before then and they are delivered",
                self._metric("BucketDestinationRefusals"),
            ),
            Alert(
                "SendsWrittenBack",
                "Messages were written back for a later run every minute for 15 minutes (BucketMessagesKeptForRetry, "
                "the timer's and the dispatch workers'): a destination throttling (503) or failing, one refusing "
                "(see DestinationRefused), or S3 or the release table failing; they are tried again every run, "
                "never dropped, but arrive late",
                self._metric("BucketMessagesKeptForRetry"),
                periods=15,
            ),
            *self._dispatch_alerts(minute),
        ]
        if self.release_rates:
            seconds = self._release_lag_seconds
            alerts.append(
                Alert(
                    "ReleaseLagHigh",
                    f"Release control (release_rates) held the tier's messages back more than "
                    f"{seconds} s: more falls due than the caps release (what has no slot within 900 s waits in "
                    "its destination's held area, BucketMessagesHeld, and later runs release it in due order, "
                    "BucketHeldReleased)",
                    product_metric("ReleaseLag", SERVICE, "Maximum", Duration.minutes(5)),
                    threshold=seconds,
                    strictly=True,
                )
            )
        for name, made in (("Ingest", self.ingest), ("Timer", self.timer), ("Dispatch", self.dispatch)):
            errors = made.function.metric_errors(period=Duration.minutes(5), statistic="Sum")
            alerts.append(Alert(f"{name}Errors", f"The time-bucket {name.lower()} function failed", errors))
        return add_alarms(self, alerts, actions)

    def _dispatch_alerts(self, minute: dict[str, Any]) -> list[Alert]:
        """The dispatch workers: tasks waiting too long, tasks given up on, runs failing, a partition too big."""
        age = DISPATCH_AGE_THRESHOLD_SECONDS
        return [
            Alert(
                "DispatchFallingBehind",
                f"The oldest dispatch task waited over {age} s for 3 minutes: big buckets are not being sent (the "
                "dispatch function failing or throttled, or dispatch_concurrency too low for the bursts)",
                self.dispatch_queue.metric_approximate_age_of_oldest_message(**minute),
                threshold=age,
                periods=3,
                strictly=True,
            ),
            Alert(
                "DispatchDlqNotEmpty",
                f"Dispatch tasks failed {DISPATCH_MAX_RECEIVES} times and reached the dispatch DLQ; the timer hands "
                "their partitions out again, but look for 'dispatch task failed' in the dispatch function's logs",
                self.dispatch_dlq.metric_approximate_number_of_messages_visible(**minute),
                threshold=0,
                strictly=True,
            ),
            Alert(
                "DispatchFailing",
                "Dispatch runs failed three minutes running (BucketDispatchFailures, caught in the handler)",
                self._metric("BucketDispatchFailures"),
                periods=3,
            ),
            Alert(
                "DispatchPartitionTooBig",
                "A dispatch worker met more ids in one partition than it remembers (BucketDispatchSeenOverflow): "
                "a copy of one of them may be sent twice; lower bucket_partition_max_messages",
                self._metric("BucketDispatchSeenOverflow"),
            ),
        ]

    def widgets(self) -> list[list[cloudwatch.IWidget]]:
        """Dashboard rows for the tier: its flow, its timing, its queues and its functions."""
        flow = cloudwatch.GraphWidget(
            title="Time buckets: messages",
            left=[
                self._metric(f"BucketMessages{n}")
                for n in ("Ingested", "Cascaded", "Dispatched", "KeptForRetry", "Held")
            ],
            right=[
                self._metric(n)
                for n in (
                    "BucketDuplicatesSkipped",
                    "BucketErrorQueueSends",
                    "BucketMessagesCancelled",
                    "BucketMessagesRescheduled",
                    "BucketHeldReleased",
                )
            ],
            width=8,
        )
        timing = cloudwatch.GraphWidget(
            title="Time buckets: oldest overdue (s), objects written, failures",
            left=[self._metric("BucketOldestOverdueSeconds", "Maximum")],
            right=[
                self._metric(n)
                for n in (
                    "BucketObjectsWritten",
                    "BucketIngestPoison",
                    "BucketIngestRetries",
                    "BucketTimerFailures",
                    "BucketDestinationRefusals",
                    "BucketRefusedToErrorQueue",
                )
            ],
            width=8,
        )
        queues = cloudwatch.GraphWidget(
            title="Ingest queue, its DLQ and the tier's error queue",
            left=[
                self.ingest_queue.metric_approximate_number_of_messages_visible(),
                self.ingest_dlq.metric_approximate_number_of_messages_visible(),
                self.error_queue.metric_approximate_number_of_messages_visible(),
            ],
            right=[self.ingest_queue.metric_approximate_age_of_oldest_message()],
            width=8,
        )
        dispatch = cloudwatch.GraphWidget(
            title="Dispatch workers: tasks waiting and their age (s), pieces and partitions",
            left=[
                self.dispatch_queue.metric_approximate_number_of_messages_visible(),
                self.dispatch_queue.metric_approximate_number_of_messages_not_visible(),
                self.dispatch_dlq.metric_approximate_number_of_messages_visible(),
                *(self._metric(n) for n in ("BucketsPlanned", "BucketPartitionsFinished", "BucketPartitionsContinued")),
            ],
            right=[self.dispatch_queue.metric_approximate_age_of_oldest_message()],
            width=24,
        )
        functions = [
            cloudwatch.GraphWidget(
                title=title,
                left=[
                    made.function.metric_invocations(),
                    made.function.metric_errors(),
                    made.function.metric_throttles(),
                ],
                right=[made.function.metric_duration(statistic="p99")],
                width=8,
            )
            for title, made in (
                ("Ingest function", self.ingest),
                ("Timer function", self.timer),
                ("Dispatch function", self.dispatch),
            )
        ]
        title = cloudwatch.TextWidget(markdown="## Time-bucket tier (S3)", width=24, height=1)
        return [[title], [flow, timing, queues], [dispatch], functions]

    def _acknowledge_prefix(self, role: iam.Role) -> None:
        """The object actions' resource ends in ``<prefix>/*``: the tier's own objects, nothing else in the bucket."""
        stack = Stack.of(self)
        logical = stack.resolve(stack.get_logical_id(self.bucket.node.default_child))  # type: ignore[arg-type]
        Validations.of(role).acknowledge(
            Acknowledgment(
                id=f"AwsSolutions-IAM5[Resource::<{logical}.Arn>/{self.prefix}/*]",
                reason="Bucket objects have content-derived keys, so the object actions name the tier's prefix "
                "(every key the tier writes) rather than keys; ListBucket is limited to that prefix by condition.",
            )
        )

    def _suppress(self) -> None:
        """cdk-nag findings that are deliberate, each acknowledged with its reason."""
        Validations.of(self.bucket).acknowledge(
            Acknowledgment(
                id="AwsSolutions-S1",
                reason="Only the tier's two functions read and write this bucket, under one prefix, each request "
                "logged by its function; S3 server access logs would add a log object per few requests to a "
                "bucket written every minute. Enable CloudTrail data events on it when an audit trail is needed.",
            )
        )
        Validations.of(self.error_queue).acknowledge(
            Acknowledgment(
                id="AwsSolutions-SQS3",
                reason="This is the tier's terminal error queue: no further DLQ; 14-day retention and an alarm as "
                "soon as it is not empty.",
            )
        )
        Validations.of(self.dispatch_dlq).acknowledge(
            Acknowledgment(
                id="AwsSolutions-SQS3",
                reason="This is the dispatch queue's dead-letter queue: 14-day retention and an alarm as soon as it "
                "is not empty (the timer hands a stalled partition out again on its own).",
            )
        )
        Validations.of(self.ingest_dlq).acknowledge(
            Acknowledgment(
                id="AwsSolutions-SQS3",
                reason="This is the ingest queue's dead-letter queue: 14-day retention and an alarm as soon as it "
                "is not empty.",
            )
        )
