"""``RecurringSchedules``: the schedules table, the every-minute schedule timer, its error queue, IAM, alarms.

The timer (``functions/aws/schedule_timer.py``) reads the table's due pages and sends each occurrence straight to its
destination queue with ``DelaySeconds``. It may send only to the destinations named here (the stack's endpoints),
its own error queue, and (with release control) take those destinations' slots from the release table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from aws_cdk import Acknowledgment, CfnOutput, Duration, RemovalPolicy, Validations
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from delayed_delivery.aws.config import RELEASE_TABLE_ENV
from delayed_delivery.aws.schedules.config import LEAD_ENV, SHARD_THREADS_ENV
from delayed_delivery.aws.schedules.layout import DEFAULT_TABLE
from delayed_delivery.aws.schedules.table import SCHEDULE_TABLE_ENV
from delayed_delivery.aws.schedules.timer import MAX_TIMER_LEAD_SECONDS
from delayed_delivery.release import RELEASE_RATES_ENV, ReleaseRates
from delayed_delivery.settings import DelayedDeliverySettings
from infra.aws.alarms import Alert, add_alarms, product_metric
from infra.aws.functions import PowertoolsFunction, powertools_function, setting_env

__all__ = ["SCHEDULE_TIMER_HANDLER", "SERVICE", "RecurringSchedules"]

SCHEDULE_TIMER_HANDLER = "functions.aws.schedule_timer.handler"
SERVICE = "delayed-delivery-schedules"
#: The timer's timeout: a burst's pass can take a while; the shard leases (150 s) outlast it.
TIMER_TIMEOUT = Duration.seconds(120)
#: 1,769 MB gives a full vCPU: planning a burst is CPU work (100,000 occurrences in ~15 s, benchmarks/schedules.py).
TIMER_MEMORY_MB = 1769
#: The lateness alarm's threshold: an occurrence became visible this long after its fire time.
LATE_ALARM_SECONDS = 60


def _grant_send(queue: sqs.IQueue, grantee: iam.IGrantable) -> None:
    queue.grant(grantee, "sqs:SendMessage", "sqs:GetQueueAttributes", "sqs:GetQueueUrl")
    if queue.encryption_master_key is not None:
        queue.encryption_master_key.grant(grantee, "kms:GenerateDataKey", "kms:Decrypt")


class RecurringSchedules(Construct):
    """The schedules table, the timer and its schedule rule, the error queue, least-privilege IAM, alarms."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        code: lambda_.Code,
        destinations: Mapping[str, sqs.IQueue],
        layers: Sequence[lambda_.ILayerVersion] = (),
        table_name: str = DEFAULT_TABLE,
        lead_seconds: int = 300,
        alarm_actions: Sequence[cloudwatch.IAlarmAction] = (),
        release_rates: ReleaseRates | None = None,
        release_table: dynamodb.ITable | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        if not destinations:
            raise ValueError("recurring schedules need at least one destination queue")
        if not 0 <= lead_seconds <= MAX_TIMER_LEAD_SECONDS:
            raise ValueError(f"lead_seconds {lead_seconds}: 0 to {MAX_TIMER_LEAD_SECONDS}")
        self.destinations = dict(destinations)
        self.table = dynamodb.Table(
            self,
            "Table",
            table_name=table_name,
            partition_key=dynamodb.Attribute(name="pk", type=dynamodb.AttributeType.STRING),
            sort_key=dynamodb.Attribute(name="sk", type=dynamodb.AttributeType.STRING),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            encryption=dynamodb.TableEncryption.AWS_MANAGED,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            removal_policy=RemovalPolicy.RETAIN,  # the users' schedules: kept when the stack goes
        )
        self.error_queue = sqs.Queue(
            self,
            "Errors",
            queue_name=f"{table_name}-errors",
            retention_period=Duration.days(14),
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
        )
        environment = {
            SCHEDULE_TABLE_ENV: self.table.table_name,
            LEAD_ENV: str(lead_seconds),
            SHARD_THREADS_ENV: "8",
            setting_env(DelayedDeliverySettings, "error_queue"): self.error_queue.queue_name,
        }
        self.release_rates = ReleaseRates.of(release_rates)
        if self.release_rates:
            if release_table is None:
                raise ValueError("release_rates caps destinations: the timer takes their slots from release_table")
            environment[RELEASE_RATES_ENV] = self.release_rates.to_json()
            environment[RELEASE_TABLE_ENV] = release_table.table_name
        self.timer = self._timer(code, layers, environment)
        if self.release_rates and release_table is not None:
            self.timer.role.add_to_policy(
                iam.PolicyStatement(
                    actions=["dynamodb:UpdateItem", "dynamodb:GetItem", "dynamodb:Query"],
                    resources=[release_table.table_arn],
                    conditions={"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": sorted(self.destinations)}},
                )
            )
        self.alarms = self._alarms(alarm_actions)
        Validations.of(self.error_queue).acknowledge(
            Acknowledgment(
                id="AwsSolutions-SQS3",
                reason="This is the schedule timer's terminal error queue (occurrences that cannot be delivered, "
                "with the reason): no further DLQ; 14-day retention and an alarm as soon as it is not empty.",
            )
        )
        CfnOutput(self, "ScheduleTable", value=self.table.table_name, description=SCHEDULE_TABLE_ENV)

    def _timer(
        self, code: lambda_.Code, layers: Sequence[lambda_.ILayerVersion], environment: dict[str, str]
    ) -> PowertoolsFunction:
        """The timer: every minute; the table's items, sends to the destinations and its error queue."""
        made = powertools_function(
            Construct(self, "TimerFunction"),
            "Function",
            handler=SCHEDULE_TIMER_HANDLER,
            code=code,
            layers=layers,
            timeout=TIMER_TIMEOUT,
            memory_size=TIMER_MEMORY_MB,
            reserved_concurrent_executions=2,
            service=SERVICE,
            description="Sends the occurrences of recurring schedules due within the lead (every minute)",
            role_description="Schedule timer: the schedules table, sends to the destinations and its error queue, "
            "its logs",
            environment=environment,
        )
        made.role.add_to_policy(
            iam.PolicyStatement(
                actions=[
                    "dynamodb:GetItem",
                    "dynamodb:BatchGetItem",
                    "dynamodb:Query",
                    "dynamodb:PutItem",
                    "dynamodb:BatchWriteItem",
                    "dynamodb:UpdateItem",
                    "dynamodb:DeleteItem",
                    "dynamodb:ConditionCheckItem",
                ],
                resources=[self.table.table_arn],
            )
        )
        for queue in (*self.destinations.values(), self.error_queue):
            _grant_send(queue, made.role)
        # A tick that cannot run (both allowed instances busy) is dropped, not retried: the next comes anyway.
        events.Rule(
            self,
            "EveryMinute",
            description="Runs the schedule timer every minute",
            schedule=events.Schedule.rate(Duration.minutes(1)),
            targets=[targets.LambdaFunction(made.function, retry_attempts=0, max_event_age=Duration.minutes(1))],
        )
        return made

    def metric(self, name: str, statistic: str = "Sum", period: Duration | None = None) -> cloudwatch.Metric:
        """One of the timer's EMF metrics, per minute unless ``period`` says."""
        return product_metric(name, SERVICE, statistic, period)

    def _alarms(self, actions: Sequence[cloudwatch.IAlarmAction]) -> list[cloudwatch.Alarm]:
        """Missed occurrences, the timer failing, late occurrences, the error queue not empty, the function's errors."""
        five = Duration.minutes(5)
        alerts = [
            Alert(
                "OccurrencesMissed",
                "Schedule occurrences were recorded as missed (catch-up policy after the timer was down, or a "
                "schedule's window/limit): their ids are in the timer's 'schedule_missed' log lines",
                self.metric("ScheduleOccurrencesMissed", period=five),
                threshold=0,
                strictly=True,
            ),
            Alert(
                "TimerFailing",
                "Schedule timer passes or schedules failed three minutes running (ScheduleTimerFailures: the "
                "function catches these); look for 'schedule_failed' in its logs",
                self.metric("ScheduleTimerFailures"),
                threshold=0,
                periods=3,
                strictly=True,
            ),
            Alert(
                "OccurrencesLate",
                f"An occurrence became visible over {LATE_ALARM_SECONDS} s after its fire time (the timer behind, "
                "throttled, or a release cap holding a burst back)",
                self.metric("ScheduleLateness", "Maximum", five),
                threshold=LATE_ALARM_SECONDS,
                strictly=True,
            ),
            Alert(
                "ErrorQueueNotEmpty",
                "Occurrences that cannot be delivered reached the schedules' error queue (with the reason)",
                self.error_queue.metric_approximate_number_of_messages_visible(period=Duration.minutes(1)),
                threshold=0,
                strictly=True,
            ),
            Alert(
                "TimerErrors",
                "The schedule timer function failed",
                self.timer.function.metric_errors(period=five, statistic="Sum"),
                threshold=0,
                strictly=True,
            ),
        ]
        return add_alarms(self, alerts, actions)

    def widgets(self) -> list[list[cloudwatch.IWidget]]:
        """Dashboard rows: occurrences fired / missed / skipped / DST-adjusted, lateness and failures, the function."""
        flow = cloudwatch.GraphWidget(
            title="Schedules: occurrences",
            left=[
                self.metric(n)
                for n in (
                    "ScheduleOccurrencesFired",
                    "ScheduleOccurrencesFiredLate",
                    "ScheduleOccurrencesMissed",
                    "ScheduleOccurrencesSkippedPaused",
                    "ScheduleDstAdjusted",
                )
            ],
            width=8,
        )
        timing = cloudwatch.GraphWidget(
            title="Schedules: lateness (s), failures, retries",
            left=[self.metric("ScheduleLateness", "Maximum")],
            right=[
                self.metric(n)
                for n in ("ScheduleTimerFailures", "ScheduleOccurrencesRetried", "ScheduleErrorQueueSends")
            ],
            width=8,
        )
        function = cloudwatch.GraphWidget(
            title="Schedule timer function",
            left=[
                self.timer.function.metric_invocations(),
                self.timer.function.metric_errors(),
                self.timer.function.metric_throttles(),
            ],
            right=[self.timer.function.metric_duration(statistic="p99")],
            width=8,
        )
        title = cloudwatch.TextWidget(markdown="## Recurring schedules", width=24, height=1)
        return [[title], [flow, timing, function]]
