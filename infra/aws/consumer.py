"""``ExampleConsumer``: the copy-this consumer (``functions/aws/consumer.py``) on an endpoint's destination queue.

Opt-in (context ``exampleConsumer: true``): a Lambda with an SQS event source on the input queue that logs and
measures each delivered message's lateness, and processes each message id once through its own idempotency table
(Powertools idempotency: partition key ``id``, TTL ``expiration``). It competes with any other consumer of that
queue, so deploy it where the example is the only one, or copy it into your own consumer.
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import RemovalPolicy
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sqs as sqs
from aws_cdk.aws_lambda_event_sources import SqsEventSource
from constructs import Construct

from infra.aws.functions import powertools_function

__all__ = ["CONSUMER_HANDLER", "ExampleConsumer"]

#: The example consumer's Lambda handler, by dotted name.
CONSUMER_HANDLER = "functions.aws.consumer.handler"


class ExampleConsumer(Construct):
    """A Lambda reading ``queue`` (batch 10, partial batch responses) with its own role and log group."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        queue: sqs.IQueue,
        queue_name: str,
        code: lambda_.Code,
        layers: Sequence[lambda_.ILayerVersion] = (),
        runtime: lambda_.Runtime = lambda_.Runtime.PYTHON_3_13,
        log_retention: logs.RetentionDays = logs.RetentionDays.ONE_MONTH,
    ) -> None:
        super().__init__(scope, construct_id)
        self.table = dynamodb.Table(
            self,
            "Processed",
            partition_key=dynamodb.Attribute(name="id", type=dynamodb.AttributeType.STRING),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            time_to_live_attribute="expiration",
            encryption=dynamodb.TableEncryption.AWS_MANAGED,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            removal_policy=RemovalPolicy.DESTROY,  # records of processed ids expire anyway
        )
        made = powertools_function(
            self,
            "Consumer",
            handler=CONSUMER_HANDLER,
            code=code,
            layers=layers,
            runtime=runtime,
            log_retention=log_retention,
            service=f"delayed-delivery-consumer-{queue_name}",
            description=f"Example consumer of {queue_name}: logs each delayed message's lateness (copy it)",
            role_description=f"Example consumer of {queue_name}: receives from that queue, its idempotency table, "
            "its logs",
            environment={"IDEMPOTENCY_TABLE": self.table.table_name},
        )
        self.function, self.role, self.log_group = made.function, made.role, made.log_group
        # What the Powertools idempotency utility calls, on this table only.
        self.table.grant(
            self.role, "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"
        )
        # The event source grants receive, delete, change visibility and attributes on this queue (and the key's
        # decrypt when it is encrypted with one); nothing else.
        self.function.add_event_source(SqsEventSource(queue, batch_size=10, report_batch_item_failures=True))
