"""``DelayedDeliveryEndpoint``: one endpoint's unrestricted delayed delivery on AWS, as a reusable construct.

It owns (or adopts) the input queue ``<name>``, creates ``<name>-delay.fifo`` to the FIFO queue rules (queue-level
delay = the hop, no redrive policy) with 14 days of retention, an error queue, the requeue function with its SQS
event source (batch 10, partial batch responses), least-privilege IAM, alarms and dashboard widgets. Every queue is
encrypted (SQS-managed keys, or a customer-managed KMS key) and refuses plain HTTP; ``-delay.fifo`` refuses
``SendMessage`` to every principal but the function and the senders granted with ``grant_send_delayed``.
The security model is described in docs/aws.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jsii
from aws_cdk import Acknowledgment, Duration, IStableListProducer, Lazy, Validations
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sqs as sqs
from aws_cdk.aws_lambda_event_sources import SqsEventSource
from constructs import Construct

from delayed_delivery.aws.config import (
    CACHE_SECONDS_ENV,
    MAX_CACHE_SECONDS,
    RELEASE_TABLE_ENV,
    TABLE_ENV,
)
from delayed_delivery.aws.settings import SqsSettings
from delayed_delivery.naming import sqs_delay_queue_name
from delayed_delivery.planning import MAX_PARK_SECONDS
from delayed_delivery.release import RELEASE_RATES_ENV
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.timebuckets.wheel import MAX_DELAY_SECONDS
from infra.aws.alarms import Alert, add_alarms, product_metric
from infra.aws.functions import METRICS_NAMESPACE, PowertoolsFunction, powertools_function, setting_env, settings_env
from infra.aws.props import RELEASE_LAG_ALARM_SECONDS, SharedProps

__all__ = [
    "BACKLOG_THRESHOLD",
    "HANDLER",
    "METRICS_NAMESPACE",
    "RELEASE_LAG_ALARM_SECONDS",
    "RETENTION",
    "DelayedDeliveryEndpoint",
]

#: The Lambda handler, by dotted name (infra never imports function code).
HANDLER = "functions.aws.requeue.handler"
#: FIFO queue retention: the longest SQS allows. The FIFO queue rules ask for >= 4 days; parking keeps 4 days of it
#: free for outages and parks within the rest, so a long delay is re-sent about every 10 days instead of every hop.
RETENTION = Duration.days(14)
#: Error queue retention: the longest SQS allows, so operators have time to look.
ERROR_RETENTION = Duration.days(14)
#: Visible (ready, not yet received) FIFO messages that, never fewer for 5 minutes, mean the requeue falls behind.
BACKLOG_THRESHOLD = 1000
#: Messages a FIFO queue may have in flight: SQS stops receives beyond this.
FIFO_MAX_IN_FLIGHT = 120_000
#: The SQS route's settings when none are given: the functions' own defaults.
DEFAULT_SQS = SqsSettings()


@jsii.implements(IStableListProducer)
class _Arns:
    """The principal ARNs allowed to send to ``-delay.fifo``, read when the template is written."""

    def __init__(self) -> None:
        self.arns: list[str] = []

    def produce(self) -> list[str]:
        """The ARNs granted so far (the function's role first)."""
        return list(self.arns)


def _check_limits(
    queue_name: str,
    max_native_delay: int,
    fifo_queue_delay: int,
    max_park_seconds: int,
    park_max_in_flight: int,
    cancellation_cache_seconds: int,
) -> None:
    """``ValueError`` for a setting outside what SQS and the function allow."""
    if not 1 <= fifo_queue_delay <= MAX_DELAY_SECONDS or not 1 <= max_native_delay <= MAX_DELAY_SECONDS:
        raise ValueError(
            f"fifo_queue_delay and max_native_delay must be 1-{MAX_DELAY_SECONDS} s (SQS's DelaySeconds range)"
        )
    if not 0 <= max_park_seconds <= MAX_PARK_SECONDS:
        raise ValueError(
            f"max_park_seconds must be 0-{MAX_PARK_SECONDS} s (SQS's 12 h visibility limit counts from the "
            "receive, less 10 minutes for the function to act; 0 = no parking)"
        )
    if not 0 <= park_max_in_flight <= FIFO_MAX_IN_FLIGHT:
        raise ValueError(
            f"park_max_in_flight must be 0-{FIFO_MAX_IN_FLIGHT} (a FIFO queue stops at that many in flight)"
        )
    if not 0 <= cancellation_cache_seconds <= MAX_CACHE_SECONDS:
        raise ValueError(f"cancellation_cache_seconds must be 0-{MAX_CACHE_SECONDS} s (well below the hop)")


def _grant_send(queue: sqs.IQueue, grantee: iam.IGrantable) -> iam.Grant:
    """Send to ``queue``; with a KMS key, the two key actions SQS needs for it (not CDK's ``ReEncrypt*`` set)."""
    grant = queue.grant(grantee, "sqs:SendMessage", "sqs:GetQueueAttributes", "sqs:GetQueueUrl")
    if queue.encryption_master_key is not None:
        queue.encryption_master_key.grant(grantee, "kms:GenerateDataKey", "kms:Decrypt")
    return grant


class DelayedDeliveryEndpoint(Construct):
    """Input queue, ``-delay.fifo`` queue, error queue, requeue function, event source, alarms for one endpoint."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        queue_name: str,
        shared: SharedProps,
        existing_queue: sqs.IQueue | None = None,
        runtime: lambda_.Runtime = lambda_.Runtime.PYTHON_3_13,
        function_timeout: Duration | None = None,
        log_retention: logs.RetentionDays = logs.RetentionDays.ONE_MONTH,
        backlog_threshold: int = BACKLOG_THRESHOLD,
        sender_arns: Sequence[str] = (),
        alarms: bool = True,
        event_source_enabled: bool = True,
    ) -> None:
        super().__init__(scope, construct_id)
        _check_limits(
            queue_name,
            shared.max_native_delay,
            shared.fifo_queue_delay,
            shared.max_park_seconds,
            shared.park_max_in_flight,
            shared.cancellation_cache_seconds,
        )
        timeout = function_timeout or Duration.seconds(30)
        self.queue_name = queue_name
        self.delay_queue_name = sqs_delay_queue_name(queue_name)
        self.service_name = f"delayed-delivery-{queue_name}"
        self.encryption_key = shared.encryption_key
        self._senders = _Arns()
        self._queues(existing_queue, shared.fifo_queue_delay, timeout)
        made = self._function(shared.code, shared.layers, runtime, timeout, log_retention)
        self.function, self.role, self.log_group = made.function, made.role, made.log_group
        sqs_settings = DEFAULT_SQS.with_(  # ConfigurationError (a ValueError) for what the function would refuse
            max_native_delay=shared.max_native_delay,
            fifo_queue_delay=shared.fifo_queue_delay,
            max_park_seconds=shared.max_park_seconds,
            park_max_in_flight=shared.park_max_in_flight,
        )
        for name, value in settings_env(
            sqs_settings, "max_native_delay", "fifo_queue_delay", "max_park_seconds", "park_max_in_flight"
        ).items():
            self.function.add_environment(name, value)
        if shared.cancellation_table is not None:
            self._read_cancellations(shared.cancellation_table, shared.cancellation_cache_seconds)
        #: Release control (``release_rates``): the cap on this endpoint's queue, None when it has none.
        self.release_rates = shared.release_rates
        self.release_rate = self.release_rates.rate_for(queue_name)
        if self.release_rate is not None:
            self._release_slots(shared.release_table)
        # The event source's grant (receive, delete, change visibility, attributes) covers this FIFO queue only:
        # parking changes visibility there, and reads its in-flight count, and nowhere else.
        # Off at rest (``event_source_enabled=False``) only for the verify probe, which switches it on while it runs.
        self.function.add_event_source(
            SqsEventSource(
                self.delay_queue, batch_size=10, report_batch_item_failures=True, enabled=event_source_enabled
            )
        )
        # Sends: back to its own FIFO queue, to its own input queue, to its own error queue. Nothing else.
        self.grant_send_delayed(self.function)
        for queue in (self.input_queue, self.error_queue):
            _grant_send(queue, self.function)
        self._senders.arns.extend(sender_arns)
        self._restrict_senders()
        self.alarms = self._alarms(backlog_threshold, shared.alarm_actions) if alarms else []
        if alarms and self.release_rate is not None:
            self.alarms.append(self._release_alarm(shared.release_lag_alarm_seconds, shared.alarm_actions))
        self._suppress()

    def grant_send_delayed(self, grantee: iam.IGrantable) -> iam.Grant:
        """Let ``grantee`` (a role or function of this app) send to ``-delay.fifo``, past the queue policy's Deny."""
        arn = getattr(grantee.grant_principal, "role_arn", None)
        if not isinstance(arn, str):
            raise TypeError("a delayed sender is a role, or runs as one (a function, a task): its ARN is the condition")
        self._senders.arns.append(arn)
        return _grant_send(self.delay_queue, grantee)

    def _encryption(self) -> dict[str, Any]:
        """Queue encryption properties: the customer-managed key when given, else SQS-managed keys."""
        if self.encryption_key is None:
            return {"encryption": sqs.QueueEncryption.SQS_MANAGED}
        return {"encryption": sqs.QueueEncryption.KMS, "encryption_master_key": self.encryption_key}

    def _queues(self, existing_queue: sqs.IQueue | None, fifo_queue_delay: int, timeout: Duration) -> None:
        """The input queue (unless adopted), ``-delay.fifo`` and the error queue, all encrypted and TLS-only."""
        self.input_queue: sqs.IQueue = existing_queue or sqs.Queue(
            self, "Input", queue_name=self.queue_name, enforce_ssl=True, **self._encryption()
        )
        self.delay_queue = sqs.Queue(
            self,
            "Delay",
            queue_name=self.delay_queue_name,
            fifo=True,
            content_based_deduplication=False,
            delivery_delay=Duration.seconds(fifo_queue_delay),
            retention_period=RETENTION,
            # Lambda needs visibility >= the function timeout; AWS advises 6x so retries are not cut short.
            visibility_timeout=Duration.seconds(timeout.to_seconds() * 6),
            enforce_ssl=True,
            **self._encryption(),
        )
        self.error_queue = sqs.Queue(
            self, "Errors", retention_period=ERROR_RETENTION, enforce_ssl=True, **self._encryption()
        )

    def _restrict_senders(self) -> None:
        """Deny ``SendMessage`` on ``-delay.fifo`` to every principal whose ARN is not a granted sender's."""
        self.delay_queue.add_to_resource_policy(
            iam.PolicyStatement(
                sid="OnlyGrantedSendersMayDelay",
                effect=iam.Effect.DENY,
                principals=[iam.AnyPrincipal()],
                actions=["sqs:SendMessage"],
                resources=[self.delay_queue.queue_arn],
                conditions={"ArnNotLike": {"aws:PrincipalArn": Lazy.list(self._senders)}},
            )
        )

    def _function(
        self,
        code: lambda_.Code,
        layers: Sequence[lambda_.ILayerVersion],
        runtime: lambda_.Runtime,
        timeout: Duration,
        log_retention: logs.RetentionDays,
    ) -> PowertoolsFunction:
        """The requeue function, traced, logging to its own group, configured by environment."""
        return powertools_function(
            self,
            "Requeue",
            handler=HANDLER,
            code=code,
            layers=layers,
            runtime=runtime,
            timeout=timeout,
            log_retention=log_retention,
            service=self.service_name,
            description=f"Moves {self.delay_queue_name} records one hop on (unrestricted delayed delivery)",
            role_description=f"Requeue function of {self.queue_name}: its own queues and log group only",
            environment={setting_env(DelayedDeliverySettings, "error_queue"): self.error_queue.queue_name},
        )

    def _read_cancellations(self, table: dynamodb.ITable, cache_seconds: int) -> None:
        """Read its endpoint's records and delete applied ones; nothing else, and only in its own partition."""
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=["dynamodb:Query", "dynamodb:DeleteItem"],
                resources=[table.table_arn],
                conditions={"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": [self.queue_name]}},
            )
        )
        self.function.add_environment(TABLE_ENV, table.table_name)
        self.function.add_environment(CACHE_SECONDS_ENV, str(cache_seconds))

    def _release_slots(self, table: dynamodb.ITable | None) -> None:
        """Release control: the rates, and the slots table in this endpoint's partition only (``release_calendar``)."""
        if table is None:
            raise ValueError(
                f"release_rates caps {self.queue_name!r}: the requeue function keeps its release slots in a DynamoDB "
                "table, give release_table (DelayedDeliveryStack creates one)"
            )
        self.function.add_environment(RELEASE_RATES_ENV, self.release_rates.to_json())
        self.function.add_environment(RELEASE_TABLE_ENV, table.table_name)
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=["dynamodb:UpdateItem", "dynamodb:GetItem", "dynamodb:Query"],
                resources=[table.table_arn],
                conditions={"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": [self.queue_name]}},
            )
        )

    def _release_alarm(self, seconds: int, actions: Sequence[cloudwatch.IAlarmAction]) -> cloudwatch.Alarm:
        """Release control holds messages back longer than ``seconds``: the capped queue has a backlog."""
        alert = Alert(
            "ReleaseLagHigh",
            f"{self.queue_name}: release control (release_rates, {self.release_rate:g}/s) held messages back "
            f"more than {seconds} s: more falls due than the cap releases",
            product_metric("ReleaseLag", self.service_name, "Maximum", Duration.minutes(5)),
            threshold=seconds,
            strictly=True,
        )
        return add_alarms(self, [alert], actions)[0]

    def _alarms(self, backlog_threshold: int, actions: Sequence[cloudwatch.IAlarmAction]) -> list[cloudwatch.Alarm]:
        alerts = [
            Alert(
                "ErrorQueueNotEmpty",
                f"{self.queue_name}: delayed messages reached the error queue",
                self.error_queue.metric_approximate_number_of_messages_visible(
                    period=Duration.minutes(1), statistic="Maximum"
                ),
            ),
            Alert(
                "FunctionErrors",
                f"{self.queue_name}: the requeue function failed",
                self.function.metric_errors(period=Duration.minutes(5), statistic="Sum"),
            ),
            # Not the age of the oldest message: a parked message is in flight for up to 12 h and counts towards
            # that age. Visible messages are the ones whose hop or park is over and that wait for the function: a
            # backlog that never drains below the threshold in 5 minutes means the requeue falls behind.
            Alert(
                "RequeueFallingBehind",
                f"{self.queue_name}: at least {backlog_threshold} delay-queue messages stayed ready and "
                "unreceived for 5 minutes, so hops are processed late",
                self.delay_queue.metric_approximate_number_of_messages_visible(
                    period=Duration.minutes(1), statistic="Minimum"
                ),
                threshold=backlog_threshold,
                periods=5,
            ),
        ]
        return add_alarms(self, alerts, actions)

    def widgets(self) -> list[cloudwatch.IWidget]:
        """Dashboard widgets for this endpoint: queues, function, and the product's own metrics."""

        def custom(name: str, statistic: str = "Sum") -> cloudwatch.Metric:
            return product_metric(name, self.service_name, statistic, Duration.minutes(5))

        return [
            cloudwatch.TextWidget(markdown=f"## {self.queue_name}", width=24, height=1),
            cloudwatch.GraphWidget(
                title="Hops",
                left=[
                    custom("Requeued"),
                    custom("Forwarded"),
                    custom("Parked"),
                    custom("ErrorQueueForwards"),
                    custom("HopFailures"),
                    custom("ParkRefusals"),
                ],
                right=[
                    custom("Cancelled"),
                    custom("Rescheduled"),
                    custom("CancellationLookupFailures"),
                    custom("ReleaseWaits"),
                ],
                width=8,
            ),
            cloudwatch.GraphWidget(
                title="Remaining delay, release lag (s)",
                left=[
                    custom("RemainingDelay", "p50"),
                    custom("RemainingDelay", "p99"),
                    custom("RemainingDelay", "Maximum"),
                ],
                right=[custom("ReleaseLag", "p99"), custom("ReleaseLag", "Maximum")],
                width=8,
            ),
            cloudwatch.GraphWidget(
                title="Delay queue (in flight = parked + being handled; FIFO stops at 120,000)",
                left=[
                    self.delay_queue.metric_approximate_number_of_messages_visible(),
                    self.delay_queue.metric_approximate_number_of_messages_not_visible(),
                ],
                right=[self.delay_queue.metric_approximate_age_of_oldest_message()],
                width=8,
            ),
            cloudwatch.GraphWidget(
                title="Function",
                left=[
                    self.function.metric_invocations(),
                    self.function.metric_errors(),
                    self.function.metric_throttles(),
                ],
                right=[self.function.metric_duration(statistic="p99")],
                width=12,
            ),
            cloudwatch.GraphWidget(
                title="Input and error queues",
                left=[self.input_queue.metric_approximate_number_of_messages_visible()],
                right=[self.error_queue.metric_approximate_number_of_messages_visible()],
                width=12,
            ),
        ]

    def _suppress(self) -> None:
        """cdk-nag findings that are deliberate, each acknowledged with its reason."""
        Validations.of(self.delay_queue).acknowledge(
            Acknowledgment(
                id="AwsSolutions-SQS3",
                reason="The FIFO queue rules forbid a redrive policy on -delay.fifo: a receive-count DLQ would "
                "silently drop long delays; the requeue function moves poison records to the error queue itself.",
            )
        )
        Validations.of(self.error_queue).acknowledge(
            Acknowledgment(
                id="AwsSolutions-SQS3",
                reason="This is the endpoint's terminal error queue (the dead-letter destination): no further DLQ; "
                "14-day retention and an alarm as soon as it is not empty.",
            )
        )
        if isinstance(self.input_queue, sqs.Queue):
            Validations.of(self.input_queue).acknowledge(
                Acknowledgment(
                    id="AwsSolutions-SQS3",
                    reason="The input queue belongs to the application, whose consumer decides its redrive policy; "
                    "pass existing_queue to manage the queue elsewhere.",
                )
            )
