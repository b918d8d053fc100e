"""``DelayedDeliveryStack``: the Powertools layer once, one endpoint per queue, the cancellation table, a dashboard,
and optionally a customer-managed KMS key for the queues, the example consumer and the S3 time-bucket tier for long
delays. Each construct's functions get a code asset of their own (``packaging``): what their handlers import."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from aws_cdk import Aws, CfnOutput, RemovalPolicy, Stack
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cloudwatch_actions
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from delayed_delivery.aws.cancellations import DEFAULT_TABLE
from delayed_delivery.aws.config import DEFAULT_CACHE_SECONDS
from delayed_delivery.aws.release_calendar import DEFAULT_RELEASE_TABLE
from delayed_delivery.aws.settings import LONG_DELAY_ROUTES, SqsSettings
from delayed_delivery.aws.tier.config import BUCKET_NAME_ENV
from delayed_delivery.envsettings import env_name
from delayed_delivery.planning import MAX_PARK_SECONDS
from delayed_delivery.release import ReleaseRates
from infra.aws.buckets import DISPATCH_HANDLER, INGEST_HANDLER, TIMER_HANDLER, TimeBucketTier
from infra.aws.consumer import CONSUMER_HANDLER, ExampleConsumer
from infra.aws.endpoint import HANDLER, RELEASE_LAG_ALARM_SECONDS, DelayedDeliveryEndpoint
from infra.aws.packaging import REPO_ROOT, prepare_function_asset
from infra.aws.probe import VerifyProbe
from infra.aws.props import SharedProps, TierOptions
from infra.aws.schedules import SCHEDULE_TIMER_HANDLER, RecurringSchedules

__all__ = [
    "ASSETS",
    "CREATE_KEY",
    "DEFAULT_CANCELLATION_TABLE",
    "LONG_DELAY_ROUTES",
    "POWERTOOLS_ACCOUNT",
    "DelayedDeliveryStack",
    "EndpointConfig",
    "powertools_layer_arn",
]

#: The AWS account that publishes the public Powertools for AWS Lambda (Python) layers.
POWERTOOLS_ACCOUNT = "017000801446"
#: The table `delayed-delivery cancel --cloud aws` writes to (unless DELAYED_DELIVERY_CANCELLATION_TABLE is set).
DEFAULT_CANCELLATION_TABLE = DEFAULT_TABLE
#: The SQS route's settings when none are given: the functions' own defaults.
DEFAULT_SQS = SqsSettings()
#: ``kms_key`` value that creates a customer-managed key (rotation on) instead of importing one by ARN.
CREATE_KEY = "create"
#: The Lambda code assets (a folder each under ``asset_dir``, default ``build/aws``) and the handlers each serves.
ASSETS: Mapping[str, tuple[str, ...]] = {
    "requeue": (HANDLER,),
    "tier": (INGEST_HANDLER, TIMER_HANDLER, DISPATCH_HANDLER),
    "consumer": (CONSUMER_HANDLER,),
    "schedules": (SCHEDULE_TIMER_HANDLER,),
}


def powertools_layer_arn(version: str, python: str = "python313", architecture: str = "x86_64") -> str:
    """The public Powertools v3 layer ARN in the stack's own region (a token resolved at deploy time)."""
    return (
        f"arn:{Aws.PARTITION}:lambda:{Aws.REGION}:{POWERTOOLS_ACCOUNT}:layer:"
        f"AWSLambdaPowertoolsPythonV3-{python}-{architecture}:{version}"
    )


@dataclass(frozen=True, slots=True)
class EndpointConfig:
    """One endpoint: its input queue name, the ARN (and KMS key ARN) of that queue when it already exists, and the
    role ARNs (``*`` patterns allowed) that may send to its ``-delay.fifo`` besides its function."""

    name: str
    existing_queue_arn: str | None = None
    existing_queue_key_arn: str | None = None
    senders: tuple[str, ...] = ()

    @classmethod
    def parse(cls, value: Any) -> EndpointConfig:
        """From context: ``"orders"`` or ``{"name", "existingQueueArn", "existingQueueKeyArn", "senders"}``."""
        if isinstance(value, str):
            return cls(value)
        if isinstance(value, dict) and isinstance(value.get("name"), str):
            senders = value.get("senders", [])
            if not isinstance(senders, list) or not all(isinstance(s, str) for s in senders):
                raise ValueError(f"endpoint {value['name']!r}: 'senders' is a list of role ARNs")
            return cls(value["name"], value.get("existingQueueArn"), value.get("existingQueueKeyArn"), tuple(senders))
        raise ValueError(f"endpoint {value!r}: use a queue name or {{'name': ..., 'existingQueueArn': ...}}")


def _check(endpoints: Sequence[EndpointConfig], long_delay_route: str) -> None:
    """``ValueError`` for no endpoint, a repeated name, or an unknown route."""
    if long_delay_route not in LONG_DELAY_ROUTES:
        raise ValueError(f"long_delay_route {long_delay_route!r}: use one of {', '.join(LONG_DELAY_ROUTES)}")
    if not endpoints:
        raise ValueError("give at least one endpoint (context 'endpoints')")
    names = [e.name for e in endpoints]
    if len(set(names)) != len(names):
        raise ValueError(f"endpoint names must be unique: {names}")


class DelayedDeliveryStack(Stack):
    """Unrestricted SQS delayed delivery for a list of endpoints."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        endpoints: Sequence[EndpointConfig],
        powertools_layer_version: str = "27",
        max_native_delay: int = DEFAULT_SQS.max_native_delay,
        fifo_queue_delay: int = DEFAULT_SQS.fifo_queue_delay,
        alarm_topic_arn: str | None = None,
        asset_dir: Path | None = None,
        cancellation_table_name: str = DEFAULT_CANCELLATION_TABLE,
        cancellation_cache_seconds: int = DEFAULT_CACHE_SECONDS,
        max_park_seconds: int = MAX_PARK_SECONDS,
        park_max_in_flight: int = DEFAULT_SQS.park_max_in_flight,
        kms_key: str | None = None,
        senders: Sequence[str] = (),
        example_consumer: bool = False,
        long_delay_route: str = DEFAULT_SQS.long_delay_route,
        bucket_tier: TierOptions | Mapping[str, Any] | None = None,
        verify_probe: bool = True,
        verify_roles: Sequence[str] = (),
        release_rates: ReleaseRates | Mapping[str, float | None] | None = None,
        release_table_name: str = DEFAULT_RELEASE_TABLE,
        release_lag_alarm_seconds: int = RELEASE_LAG_ALARM_SECONDS,
        recurring_schedules: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        _check(endpoints, long_delay_route)
        folder = asset_dir or REPO_ROOT / "build" / "aws"
        code = {
            name: lambda_.Code.from_asset(str(prepare_function_asset(h, folder / name))) for name, h in ASSETS.items()
        }
        layer = lambda_.LayerVersion.from_layer_version_arn(
            self, "Powertools", powertools_layer_arn(powertools_layer_version)
        )
        actions: list[cloudwatch.IAlarmAction] = (
            [cloudwatch_actions.SnsAction(sns.Topic.from_topic_arn(self, "AlarmTopic", alarm_topic_arn))]
            if alarm_topic_arn
            else []
        )
        self.cancellation_table = self._ttl_table(  # one partition per endpoint
            "Cancellations", cancellation_table_name, "endpoint", ("message_id", dynamodb.AttributeType.STRING)
        )
        CfnOutput(self, "CancellationTable", value=self.cancellation_table.table_name)
        self.encryption_key = self._key(kms_key)
        rates = ReleaseRates.of(release_rates)  # ValueError names a bad entry
        #: Release control's slots table (``aws.release_calendar``), made when ``release_rates`` caps anything.
        self.release_table = (  # a destination's partition, an item per second it releases in
            self._ttl_table(
                "ReleaseSlots", release_table_name, "destination", ("second", dynamodb.AttributeType.NUMBER)
            )
            if rates
            else None
        )
        if self.release_table is not None:
            CfnOutput(self, "ReleaseTable", value=self.release_table.table_name)
        shared = SharedProps(
            code=code["requeue"],
            layers=[layer],
            max_native_delay=max_native_delay,
            fifo_queue_delay=fifo_queue_delay,
            max_park_seconds=max_park_seconds,
            park_max_in_flight=park_max_in_flight,
            alarm_actions=actions,
            cancellation_table=self.cancellation_table,
            cancellation_cache_seconds=cancellation_cache_seconds,
            encryption_key=self.encryption_key,
            release_rates=rates,
            release_table=self.release_table,
            release_lag_alarm_seconds=release_lag_alarm_seconds,
        )
        self.endpoints = [self._endpoint(config, senders, shared) for config in endpoints]
        self.probe = self._probe([*senders, *verify_roles], shared) if verify_probe else None
        self.consumers = [self._consumer(e, code["consumer"], layer) for e in self.endpoints if example_consumer]
        self.buckets = (
            None
            if long_delay_route == "fifo"
            else self._buckets(
                long_delay_route,
                endpoints,
                [*senders, *verify_roles],
                replace(shared, code=code["tier"]),
                TierOptions.of(bucket_tier),
            )
        )
        #: Recurring schedules (``recurring_schedules``: None leaves them out; ``{}`` deploys them with defaults).
        self.schedules = (
            None
            if recurring_schedules is None
            else RecurringSchedules(
                self,
                "Schedules",
                code=code["schedules"],
                layers=[layer],
                destinations={e.queue_name: e.input_queue for e in self.endpoints},
                alarm_actions=actions,
                release_rates=rates,
                release_table=self.release_table,
                **recurring_schedules,
            )
        )
        self.dashboard = self._dashboard(construct_id)

    def _consumer(
        self, endpoint: DelayedDeliveryEndpoint, code: lambda_.Code, layer: lambda_.ILayerVersion
    ) -> ExampleConsumer:
        """The example consumer on ``endpoint``'s input queue."""
        return ExampleConsumer(
            self,
            f"ExampleConsumer-{endpoint.queue_name}",
            queue=endpoint.input_queue,
            queue_name=endpoint.queue_name,
            code=code,
            layers=[layer],
        )

    def _probe(self, senders: Sequence[str], shared: SharedProps) -> VerifyProbe:
        """The endpoint `aws verify` probes through: no alarms, its event source off at rest (zero idle cost)."""
        probe = VerifyProbe(self, "VerifyProbe", shared=shared, sender_arns=senders)
        CfnOutput(self, "ProbeQueue", value=probe.queue_name, description="the probe endpoint of `aws verify`")
        return probe

    def _destinations(self) -> list[DelayedDeliveryEndpoint]:
        """The endpoints the tier dispatches to: every endpoint, and the probe endpoint."""
        return [*self.endpoints, *([self.probe.endpoint] if self.probe else [])]

    def _dashboard(self, construct_id: str) -> cloudwatch.Dashboard:
        """One dashboard: a section per endpoint, then the time-bucket tier's rows."""
        dashboard = cloudwatch.Dashboard(self, "Dashboard", dashboard_name=f"{construct_id}-delayed-delivery")
        for endpoint in self.endpoints:
            title, *graphs = endpoint.widgets()
            dashboard.add_widgets(title)
            dashboard.add_widgets(*graphs[:3])
            dashboard.add_widgets(*graphs[3:])
        for row in self.buckets.widgets() if self.buckets else []:
            dashboard.add_widgets(*row)
        for row in self.schedules.widgets() if self.schedules else []:
            dashboard.add_widgets(*row)
        return dashboard

    def _buckets(
        self,
        route: str,
        endpoints: Sequence[EndpointConfig],
        senders: Sequence[str],
        shared: SharedProps,
        options: TierOptions,
    ) -> TimeBucketTier:
        """The time-bucket tier dispatching to every endpoint's input queue, and what a sender needs from it."""
        tier = TimeBucketTier(
            self,
            "TimeBuckets",
            shared=shared,
            destinations={e.queue_name: e.input_queue for e in self._destinations()},
            sender_arns=[*senders, *(s for e in endpoints for s in e.senders)],
            options=options,
        )
        CfnOutput(self, "BucketName", value=tier.bucket.bucket_name, description=BUCKET_NAME_ENV)
        CfnOutput(self, "IngestQueueUrl", value=tier.ingest_queue.queue_url)
        CfnOutput(
            self,
            "SenderIngestQueue",
            value=tier.ingest_queue.queue_name,
            description=f"{env_name('bucket_ingest_queue')} for senders",
        )
        CfnOutput(self, "SenderLongDelayRoute", value=route, description=f"{env_name('long_delay_route')} for senders")
        return tier

    def _ttl_table(
        self, construct_id: str, name: str, partition: str, sort: tuple[str, dynamodb.AttributeType]
    ) -> dynamodb.Table:
        """A table of transient records: on demand, SSE with the AWS managed key, PITR, TTL on ``expires_at``."""
        # DESTROY: every record expires on its own (cancel / reschedule records ≤ 5 days, release slots a day).
        return dynamodb.Table(
            self,
            construct_id,
            table_name=name,
            partition_key=dynamodb.Attribute(name=partition, type=dynamodb.AttributeType.STRING),
            sort_key=dynamodb.Attribute(name=sort[0], type=sort[1]),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            time_to_live_attribute="expires_at",
            encryption=dynamodb.TableEncryption.AWS_MANAGED,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            removal_policy=RemovalPolicy.DESTROY,
        )

    def _endpoint(self, config: EndpointConfig, senders: Sequence[str], shared: SharedProps) -> DelayedDeliveryEndpoint:
        """One endpoint (adopting its input queue, and that queue's KMS key, when they exist) and its outputs."""
        existing = (
            sqs.Queue.from_queue_attributes(
                self,
                f"Existing-{config.name}",
                queue_arn=config.existing_queue_arn,
                key_arn=config.existing_queue_key_arn,  # sends to it are granted the key's use
            )
            if config.existing_queue_arn
            else None
        )
        endpoint = DelayedDeliveryEndpoint(
            self,
            f"Endpoint-{config.name}",
            queue_name=config.name,
            shared=shared,
            existing_queue=existing,
            sender_arns=[*senders, *config.senders],
        )
        CfnOutput(self, f"{config.name}-DelayQueueUrl", value=endpoint.delay_queue.queue_url)
        CfnOutput(self, f"{config.name}-ErrorQueueUrl", value=endpoint.error_queue.queue_url)
        CfnOutput(self, f"{config.name}-LogGroup", value=endpoint.log_group.log_group_name)
        return endpoint

    def _key(self, kms_key: str | None) -> kms.IKey | None:
        """No key (SQS-managed encryption), a new customer-managed key with rotation, or one imported by ARN."""
        if not kms_key:
            return None
        if kms_key == CREATE_KEY:
            return kms.Key(
                self,
                "QueueKey",
                description="Delayed delivery queues (input, -delay.fifo, error)",
                enable_key_rotation=True,
                removal_policy=RemovalPolicy.RETAIN,  # messages may wait in a queue for 14 days
            )
        if not kms_key.startswith("arn:"):
            raise ValueError(f"kms_key {kms_key!r}: use {CREATE_KEY!r} or a KMS key ARN")
        return kms.Key.from_key_arn(self, "QueueKey", kms_key)
