"""The time-bucket tier in the CDK app: absent with ``longDelayRoute`` fifo; with ``buckets`` or ``auto`` (the
default) the S3 bucket (SSE, public access blocked, TLS, lifecycle, kept), the ingest queue with its DLQ, the ingest
and timer functions, prefix-scoped IAM, alarms, dashboard and outputs; cdk-nag and cfn-lint clean."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.infra

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

import aws_cdk as cdk  # noqa: E402
from aws_cdk.assertions import Match, Template  # noqa: E402

from delayed_delivery.aws.settings import SqsSettings  # noqa: E402
from infra.aws.app import build  # noqa: E402
from infra.aws.buckets import DISPATCH_HANDLER, INGEST_HANDLER, TIMER_HANDLER, TimeBucketTier  # noqa: E402
from tests.infra.test_assets import assert_functions_use_their_assets  # noqa: E402
from tests.infra.test_aws_stack import (  # noqa: E402
    _actions,
    _cfn_lint,
    _logical_id,
    _resources,
    _send_denials,
    _synth,
)

PREFIX = "delayed-delivery/buckets"
KEY_ARN = "arn:aws:kms:us-east-1:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab"

Synth = tuple[Template, dict[str, Any], Path]


@pytest.fixture(scope="module")
def tier(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    return _synth(tmp_path_factory.mktemp("tier"), {"endpoints": ["orders", "billing"], "longDelayRoute": "buckets"})


def _function(raw: dict[str, Any], handler: str) -> tuple[str, dict[str, Any]]:
    [found] = [
        (k, v) for k, v in _resources(raw, "AWS::Lambda::Function").items() if v["Properties"]["Handler"] == handler
    ]
    return found


def _statements(raw: dict[str, Any], function: dict[str, Any]) -> list[dict[str, Any]]:
    role = function["Properties"]["Role"]["Fn::GetAtt"][0]
    [policy] = [p for p in _resources(raw, "AWS::IAM::Policy").values() if p["Properties"]["Roles"] == [{"Ref": role}]]
    statements: list[dict[str, Any]] = policy["Properties"]["PolicyDocument"]["Statement"]
    return statements


def _role(raw: dict[str, Any], handler: str) -> str:
    """The logical id of the role the function with ``handler`` runs as."""
    role: str = _function(raw, handler)[1]["Properties"]["Role"]["Fn::GetAtt"][0]
    return role


def _bucket(raw: dict[str, Any]) -> str:
    [bucket] = _resources(raw, "AWS::S3::Bucket")
    return bucket


def _tier_errors(raw: dict[str, Any]) -> str:
    [errors] = [k for k in _resources(raw, "AWS::SQS::Queue") if k.startswith("TimeBucketsErrors")]
    return errors


def _dispatch(raw: dict[str, Any]) -> str:
    [queue] = [k for k in _resources(raw, "AWS::SQS::Queue") if k.startswith("TimeBucketsDispatch") and "Dlq" not in k]
    return queue


def _objects(bucket: str, prefix: str = PREFIX) -> dict[str, Any]:
    return {"Fn::Join": ["", [{"Fn::GetAtt": [bucket, "Arn"]}, f"/{prefix}/*"]]}


def test_absent_with_the_fifo_route(tmp_path: Path) -> None:
    _, raw, _ = _synth(tmp_path, {"endpoints": ["orders"], "longDelayRoute": "fifo"})
    assert not _resources(raw, "AWS::S3::Bucket")
    assert not _resources(raw, "AWS::Events::Rule")
    assert len(_resources(raw, "AWS::Lambda::Function")) == 1
    assert "BucketName" not in raw["Outputs"]
    with pytest.raises(ValueError, match="long_delay_route"):
        _synth(tmp_path / "bad", {"endpoints": ["orders"], "longDelayRoute": "s3"})


def test_auto_is_the_default_and_deploys_the_tier(tmp_path: Path) -> None:
    assert SqsSettings().long_delay_route == "auto"
    cdk_json = json.loads((Path(__file__).resolve().parents[2] / "infra" / "aws" / "cdk.json").read_text())
    assert cdk_json["context"]["longDelayRoute"] == "auto"  # `cdk deploy` and the app agree
    app = cdk.App(outdir=str(tmp_path / "cdk.out"), context={"endpoints": ["orders"], "verifyProbe": False})
    stack = build(app)
    raw = json.loads(Path(app.synth().get_stack_artifact(stack.artifact_id).template_full_path).read_text())
    assert len(_resources(raw, "AWS::S3::Bucket")) == 1
    assert len(_resources(raw, "AWS::Events::Rule")) == 1  # the timer
    assert raw["Outputs"]["SenderLongDelayRoute"]["Value"] == "auto"
    handlers = {r["Properties"]["Handler"] for r in _resources(raw, "AWS::Lambda::Function").values()}
    assert {INGEST_HANDLER, TIMER_HANDLER} <= handlers


def test_bucket_is_private_encrypted_tls_only_unversioned_kept_with_lifecycle(tier: Synth) -> None:
    template, raw, _ = tier
    bucket = _bucket(raw)
    template.has_resource(
        "AWS::S3::Bucket",
        {
            "DeletionPolicy": "Retain",
            "UpdateReplacePolicy": "Retain",
            "Properties": {
                "BucketEncryption": {
                    "ServerSideEncryptionConfiguration": [{"ServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]
                },
                "PublicAccessBlockConfiguration": {
                    "BlockPublicAcls": True,
                    "BlockPublicPolicy": True,
                    "IgnorePublicAcls": True,
                    "RestrictPublicBuckets": True,
                },
                "VersioningConfiguration": Match.absent(),
                "LifecycleConfiguration": {
                    "Rules": Match.array_with(
                        [
                            Match.object_like(
                                {"AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1}, "Status": "Enabled"}
                            ),
                            Match.object_like(
                                {"Prefix": f"{PREFIX}/leases/", "ExpirationInDays": 2, "Status": "Enabled"}
                            ),
                            Match.object_like(
                                {"Prefix": f"{PREFIX}/plans/", "ExpirationInDays": 7, "Status": "Enabled"}
                            ),
                        ]
                    )
                },
            },
        },
    )
    [rules] = [b["Properties"]["LifecycleConfiguration"]["Rules"] for b in _resources(raw, "AWS::S3::Bucket").values()]
    expiring = {f"{PREFIX}/leases/", f"{PREFIX}/plans/"}  # leases and plans, never a message
    assert all("ExpirationInDays" not in r or r.get("Prefix") in expiring for r in rules), "no message expires"
    [policy] = _resources(raw, "AWS::S3::BucketPolicy").values()
    assert policy["Properties"]["Bucket"] == {"Ref": bucket}
    [deny] = policy["Properties"]["PolicyDocument"]["Statement"]
    assert (deny["Effect"], deny["Action"], deny["Condition"]) == (
        "Deny",
        "s3:*",
        {"Bool": {"aws:SecureTransport": "false"}},
    )


def test_ingest_queue_is_encrypted_with_a_dlq_and_room_for_retries(tier: Synth) -> None:
    template, raw, _ = tier
    dlq = _logical_id(raw, "AWS::SQS::Queue", QueueName="delayed-delivery-ingest-dlq")
    template.has_resource_properties(
        "AWS::SQS::Queue",
        {
            "QueueName": "delayed-delivery-ingest",
            "SqsManagedSseEnabled": True,
            "MessageRetentionPeriod": 14 * 86_400,
            "VisibilityTimeout": 6 * 60 + 300,  # 6x the 60 s ingest timeout, plus the 300 s batching window
            "RedrivePolicy": {"deadLetterTargetArn": {"Fn::GetAtt": [dlq, "Arn"]}, "maxReceiveCount": 5},
        },
    )
    template.has_resource_properties(
        "AWS::SQS::Queue", {"QueueName": "delayed-delivery-ingest-dlq", "MessageRetentionPeriod": 14 * 86_400}
    )
    queues = _resources(raw, "AWS::SQS::Queue")
    guarded = set()
    for policy in _resources(raw, "AWS::SQS::QueuePolicy").values():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            if statement["Effect"] == "Deny" and statement.get("Condition") == {
                "Bool": {"aws:SecureTransport": "false"}
            }:
                guarded.update(q["Ref"] for q in policy["Properties"]["Queues"])
    assert guarded == set(queues)  # the tier's three queues too
    assert all(q["Properties"].get("SqsManagedSseEnabled") is True for q in queues.values())


def test_ingest_function_reads_big_batches_with_partial_failures(tier: Synth) -> None:
    template, raw, _ = tier
    ingest_queue = _logical_id(raw, "AWS::SQS::Queue", QueueName="delayed-delivery-ingest")
    name, function = _function(raw, INGEST_HANDLER)
    template.has_resource_properties(
        "AWS::Lambda::EventSourceMapping",
        {
            "EventSourceArn": {"Fn::GetAtt": [ingest_queue, "Arn"]},
            "FunctionName": {"Ref": name},
            "BatchSize": 1000,
            "MaximumBatchingWindowInSeconds": 300,  # objects fill over 5 minutes at low traffic (#24)
            "FunctionResponseTypes": ["ReportBatchItemFailures"],
        },
    )
    props = function["Properties"]
    assert (props["Timeout"], props["Runtime"], props["TracingConfig"]) == (60, "python3.13", {"Mode": "Active"})


def test_timer_runs_every_minute_one_at_a_time(tier: Synth) -> None:
    template, raw, _ = tier
    name, function = _function(raw, TIMER_HANDLER)
    assert function["Properties"]["ReservedConcurrentExecutions"] == 1
    assert function["Properties"]["Timeout"] == 300
    template.has_resource_properties(
        "AWS::Events::Rule",
        {
            "ScheduleExpression": "rate(1 minute)",
            "State": "ENABLED",
            "Targets": [Match.object_like({"Arn": {"Fn::GetAtt": [name, "Arn"]}})],
        },
    )
    template.has_resource_properties(
        "AWS::Lambda::Permission",
        {"Action": "lambda:InvokeFunction", "Principal": "events.amazonaws.com", "FunctionName": Match.any_value()},
    )
    [rule] = _resources(raw, "AWS::Events::Rule").values()
    assert rule["Properties"]["Targets"][0]["RetryPolicy"] == {
        "MaximumRetryAttempts": 0,
        "MaximumEventAgeInSeconds": 60,
    }


def test_the_functions_get_the_tier_environment(tier: Synth) -> None:
    _, raw, _ = tier
    bucket = _bucket(raw)
    errors = _tier_errors(raw)
    [table] = _resources(raw, "AWS::DynamoDB::Table")
    for handler in (INGEST_HANDLER, TIMER_HANDLER, DISPATCH_HANDLER):
        env = _function(raw, handler)[1]["Properties"]["Environment"]["Variables"]
        assert env["DELAYED_DELIVERY_BUCKET_NAME"] == {"Ref": bucket}
        assert env["DELAYED_DELIVERY_BUCKET_PREFIX"] == PREFIX
        assert env["DELAYED_DELIVERY_BUCKET_INGEST_QUEUE"] == "delayed-delivery-ingest"
        assert env["DELAYED_DELIVERY_ERROR_QUEUE"] == {"Fn::GetAtt": [errors, "QueueName"]}
        assert env["DELAYED_DELIVERY_BUCKET_FINE_SECONDS"] == "60"
        assert env["DELAYED_DELIVERY_BUCKET_COARSE_SECONDS"] == "86400"
        assert env["DELAYED_DELIVERY_BUCKET_DISPATCH_LEAD_SECONDS"] == "420"
        assert env["DELAYED_DELIVERY_BUCKET_REFUSED_RETRY_SECONDS"] == "3600"
        assert env["DELAYED_DELIVERY_BUCKET_DESTINATIONS"] == "billing,orders"
        assert env["POWERTOOLS_SERVICE_NAME"] == "delayed-delivery-buckets"
        assert env["POWERTOOLS_METRICS_NAMESPACE"] == "DelayedDelivery"
        assert env["DELAYED_DELIVERY_CANCELLATION_TABLE"] == {"Ref": table}
        assert env["DELAYED_DELIVERY_BUCKET_DISPATCH_QUEUE"] == {"Fn::GetAtt": [_dispatch(raw), "QueueName"]}
        assert env["DELAYED_DELIVERY_BUCKET_DISPATCH_CONCURRENCY"] == "32"


def test_ingest_may_only_write_objects_under_the_prefix_and_send_to_the_error_queue(tier: Synth) -> None:
    _, raw, _ = tier
    bucket = _bucket(raw)
    ingest_queue = _logical_id(raw, "AWS::SQS::Queue", QueueName="delayed-delivery-ingest")
    errors = _tier_errors(raw)
    granted: dict[str, set[str]] = {}
    for statement in _statements(raw, _function(raw, INGEST_HANDLER)[1]):
        key = json.dumps(statement["Resource"], sort_keys=True)
        granted.setdefault(key, set()).update(_actions(statement))
        assert "Condition" not in statement
    assert granted.pop(json.dumps(_objects(bucket), sort_keys=True)) == {"s3:PutObject"}
    assert {"sqs:ReceiveMessage", "sqs:DeleteMessage"} <= granted.pop(
        json.dumps({"Fn::GetAtt": [ingest_queue, "Arn"]}, sort_keys=True)
    )
    assert granted.pop(json.dumps({"Fn::GetAtt": [errors, "Arn"]}, sort_keys=True)) == {
        "sqs:SendMessage",
        "sqs:GetQueueAttributes",
        "sqs:GetQueueUrl",
    }
    assert granted.pop('"*"') == {"xray:PutTraceSegments", "xray:PutTelemetryRecords"}
    [(logs, actions)] = granted.items()
    assert "Logs" in logs and actions == {"logs:CreateLogStream", "logs:PutLogEvents"}


@pytest.mark.parametrize("handler", [TIMER_HANDLER, DISPATCH_HANDLER])
def test_timer_and_workers_are_scoped_to_the_prefix_the_destinations_the_queues_and_their_records(
    tier: Synth, handler: str
) -> None:
    _, raw, _ = tier
    bucket = _bucket(raw)
    statements = _statements(raw, _function(raw, handler)[1])
    [listing] = [s for s in statements if "s3:ListBucket" in _actions(s)]
    assert _actions(listing) == ["s3:ListBucket"] and listing["Resource"] == {"Fn::GetAtt": [bucket, "Arn"]}
    assert listing["Condition"] == {"StringLike": {"s3:prefix": [f"{PREFIX}/*"]}}
    [objects] = [s for s in statements if s["Resource"] == _objects(bucket)]
    assert sorted(_actions(objects)) == ["s3:DeleteObject", "s3:GetObject", "s3:PutObject"]
    sends = {
        s["Resource"]["Fn::GetAtt"][0]
        for s in statements
        if "sqs:SendMessage" in _actions(s) and "Fn::GetAtt" in s["Resource"]
    }
    orders = _logical_id(raw, "AWS::SQS::Queue", QueueName="orders")
    billing = _logical_id(raw, "AWS::SQS::Queue", QueueName="billing")
    errors = _tier_errors(raw)
    assert sends == {orders, billing, errors, _dispatch(raw)}  # the dispatch queue: tasks handed on
    receives = [s["Resource"] for s in statements if "sqs:ReceiveMessage" in _actions(s)]
    assert receives == ([] if handler == TIMER_HANDLER else [{"Fn::GetAtt": [_dispatch(raw), "Arn"]}])
    [records] = [s for s in statements if any(a.startswith("dynamodb:") for a in _actions(s))]
    [table] = _resources(raw, "AWS::DynamoDB::Table")
    assert sorted(_actions(records)) == ["dynamodb:DeleteItem", "dynamodb:Query"]
    assert records["Resource"] == {"Fn::GetAtt": [table, "Arn"]}
    assert records["Condition"] == {"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": ["billing", "orders"]}}
    wide = [a for s in statements for a in _actions(s) if a.endswith("*") or (s["Resource"] == "*" and "xray" not in a)]
    assert not wide


def test_alarms_on_overdue_buckets_ingest_age_the_dlq_and_errors(tier: Synth) -> None:
    _, raw, _ = tier
    alarms = [a["Properties"] for a in _resources(raw, "AWS::CloudWatch::Alarm").values()]
    [overdue] = [a for a in alarms if a["MetricName"] == "BucketOldestOverdueSeconds"]
    assert (overdue["Namespace"], overdue["Threshold"], overdue["ComparisonOperator"]) == (
        "DelayedDelivery",
        120,
        "GreaterThanThreshold",
    )
    assert overdue["Dimensions"] == [{"Name": "service", "Value": "delayed-delivery-buckets"}]
    ingest_queue = _logical_id(raw, "AWS::SQS::Queue", QueueName="delayed-delivery-ingest")
    dlq = _logical_id(raw, "AWS::SQS::Queue", QueueName="delayed-delivery-ingest-dlq")
    [age] = [a for a in alarms if a["MetricName"] == "ApproximateAgeOfOldestMessage" and ingest_queue in json.dumps(a)]
    assert age["Dimensions"][0]["Value"] == {"Fn::GetAtt": [ingest_queue, "QueueName"]}
    assert age["Threshold"] == 900 - 60 - 420  # past it, a 901 s delay misses its bucket's first dispatch
    [dead] = [a for a in alarms if a["MetricName"] == "ApproximateNumberOfMessagesVisible" and dlq in json.dumps(a)]
    assert (dead["Threshold"], dead["ComparisonOperator"]) == (0, "GreaterThanThreshold")
    [failing] = [a for a in alarms if a["MetricName"] == "BucketTimerFailures"]  # caught in the handler
    assert (failing["Namespace"], failing["EvaluationPeriods"], failing["Statistic"]) == ("DelayedDelivery", 3, "Sum")
    [refused] = [a for a in alarms if a["MetricName"] == "BucketDestinationRefusals"]  # #23: before the give-up
    assert (refused["Namespace"], refused["Threshold"], refused["Statistic"]) == ("DelayedDelivery", 1, "Sum")
    assert "3600 s past their due time" in refused["AlarmDescription"]
    errors = [a for a in alarms if a["MetricName"] == "Errors"]
    functions = {json.dumps(a["Dimensions"]) for a in errors}
    for handler in (INGEST_HANDLER, TIMER_HANDLER, DISPATCH_HANDLER):
        name, _ = _function(raw, handler)
        assert any(name in f for f in functions), handler
    dispatch, dispatch_dlq = _dispatch(raw), f"{_dispatch(raw).replace('Dispatch', 'DispatchDlq', 1)}"
    [behind] = [a for a in alarms if a["MetricName"] == "ApproximateAgeOfOldestMessage" and dispatch in json.dumps(a)]
    assert (behind["Threshold"], behind["EvaluationPeriods"]) == (300, 3)
    assert [
        a for a in alarms if a["MetricName"] == "ApproximateNumberOfMessagesVisible" and "DispatchDlq" in json.dumps(a)
    ]
    assert {"BucketDispatchFailures", "BucketDispatchSeenOverflow"} <= {a["MetricName"] for a in alarms}
    assert dispatch_dlq
    [dashboard] = _resources(raw, "AWS::CloudWatch::Dashboard").values()
    body = json.dumps(dashboard["Properties"]["DashboardBody"])
    for metric in (
        "BucketMessagesIngested",
        "BucketMessagesDispatched",
        "BucketOldestOverdueSeconds",
        "BucketTimerFailures",
        "BucketMessagesCancelled",
        "BucketDestinationRefusals",
        "BucketRefusedToErrorQueue",
        "Requeued",
        "BucketPartitionsFinished",
        "BucketsPlanned",
    ):
        assert metric in body


def _emitted_tier_metrics() -> set[str]:
    """Every EMF metric name the tier's functions emit: their result fields' (``METRICS``) and the named ones."""
    import re

    from delayed_delivery.aws.tier import timer_handler, worker_handler

    emitted = {name for name, _ in (*timer_handler.METRICS.values(), *worker_handler.METRICS.values())}
    handlers = Path(timer_handler.__file__).parent
    for source in handlers.glob("*_handler.py"):
        emitted |= set(re.findall(r'add_metric\(name="(\w+)"', source.read_text(encoding="utf-8")))
    return emitted


def test_every_alarmed_tier_metric_is_one_the_functions_emit(tier: Synth) -> None:
    # an alarm on a metric nobody emits never fires (#31): the synthesized alarms, and those only some stacks get
    # (ReleaseLag with releaseRates), read from the construct's source
    import re

    import infra.aws.buckets as construct

    _, raw, _ = tier
    alarms = [a["Properties"] for a in _resources(raw, "AWS::CloudWatch::Alarm").values()]
    alarmed = {a["MetricName"] for a in alarms if a.get("Namespace") == "DelayedDelivery"}
    alarmed |= set(re.findall(r'_metric\(\s*"(\w+)"', Path(construct.__file__).read_text(encoding="utf-8")))
    assert {"BucketDestinationRefusals", "BucketMessagesKeptForRetry", "ReleaseLag"} <= alarmed
    missing = alarmed - _emitted_tier_metrics()
    assert not missing, f"alarmed but never emitted: {sorted(missing)}"


def test_every_path_that_writes_messages_back_or_holds_them_has_a_metric() -> None:
    from dataclasses import fields

    from delayed_delivery.aws.tier import timer_handler, worker_handler
    from delayed_delivery.aws.tier.timer import TimerResult
    from delayed_delivery.aws.tier.worker import WorkerResult

    written_back = {"kept_for_retry", "refused", "refused_given_up", "release_held", "held_written", "rescheduled"}
    for result, metrics in ((TimerResult, timer_handler.METRICS), (WorkerResult, worker_handler.METRICS)):
        names = {f.name for f in fields(result)}
        assert set(metrics) <= names, result  # each metric is a field of the result it reports
        wanted = {n for n in names if n in written_back or n.startswith("held_")}
        assert wanted <= set(metrics), (result.__name__, sorted(wanted - set(metrics)))


def test_destination_refused_says_what_the_code_does(tier: Synth) -> None:
    from delayed_delivery.aws.tier.config import TierSettings

    _, raw, _ = tier
    alarms = [a["Properties"] for a in _resources(raw, "AWS::CloudWatch::Alarm").values()]
    [refused] = [a for a in alarms if a["MetricName"] == "BucketDestinationRefusals"]
    text = refused["AlarmDescription"]
    # the timer and the dispatch workers both count refusals; both write the messages back outside their plan and
    # give them up after the same bound (tests/aws/tier/test_plan_writebacks.py, test_destinations.py)
    assert "dispatch worker" in text and "written back" in text and "error queue" in text
    assert f"{TierSettings().bucket_refused_retry_seconds} s past their due time" in text
    [back] = [a for a in alarms if a["MetricName"] == "BucketMessagesKeptForRetry"]
    assert back["EvaluationPeriods"] == 15 and "503" in back["AlarmDescription"]


def test_outputs_name_what_a_sender_needs(tier: Synth) -> None:
    _, raw, _ = tier
    outputs = raw["Outputs"]
    assert outputs["BucketName"]["Value"] == {"Ref": _bucket(raw)}
    ingest_queue = _logical_id(raw, "AWS::SQS::Queue", QueueName="delayed-delivery-ingest")
    assert outputs["IngestQueueUrl"]["Value"] == {"Ref": ingest_queue}
    assert outputs["SenderIngestQueue"]["Value"] == {"Fn::GetAtt": [ingest_queue, "QueueName"]}
    assert "DELAYED_DELIVERY_BUCKET_INGEST_QUEUE" in outputs["SenderIngestQueue"]["Description"]
    assert outputs["SenderLongDelayRoute"]["Value"] == "buckets"
    assert "DELAYED_DELIVERY_LONG_DELAY_ROUTE" in outputs["SenderLongDelayRoute"]["Description"]


def test_the_tier_functions_run_from_their_own_asset(tier: Synth) -> None:
    _, raw, path = tier
    assert_functions_use_their_assets(raw, path)
    handlers = {r["Properties"]["Handler"] for r in _resources(raw, "AWS::Lambda::Function").values()}
    assert {INGEST_HANDLER, TIMER_HANDLER, DISPATCH_HANDLER} <= handlers


def test_cfn_lint_passes_with_the_tier(tier: Synth) -> None:
    _cfn_lint(tier[2])


def test_a_key_encrypts_the_bucket_and_queues_and_is_granted(tmp_path: Path) -> None:
    context = {
        "endpoints": ["orders"],
        "longDelayRoute": "auto",
        "kmsKey": KEY_ARN,
        "delaySenders": "arn:aws:iam::111122223333:role/ops-*",
        "bucketPrefix": "dd/tier",
        "bucketIngestQueue": "tier-ingest",
    }
    _, raw, path = _synth(tmp_path, context)
    [bucket] = _resources(raw, "AWS::S3::Bucket").values()
    [rule] = bucket["Properties"]["BucketEncryption"]["ServerSideEncryptionConfiguration"]
    assert rule["ServerSideEncryptionByDefault"] == {"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": KEY_ARN}
    assert {q["Properties"].get("KmsMasterKeyId") for q in _resources(raw, "AWS::SQS::Queue").values()} == {KEY_ARN}
    for handler in (INGEST_HANDLER, TIMER_HANDLER):
        statements = _statements(raw, _function(raw, handler)[1])
        used = {a for s in statements if s["Resource"] == KEY_ARN for a in _actions(s)}
        assert {"kms:GenerateDataKey", "kms:Decrypt"} <= used
        assert "/dd/tier/*" in json.dumps(statements)
    ingest = _logical_id(raw, "AWS::SQS::Queue", QueueName="tier-ingest")
    [policy] = [
        p for p in _resources(raw, "AWS::SQS::QueuePolicy").values() if p["Properties"]["Queues"] == [{"Ref": ingest}]
    ]
    [deny] = [
        s for s in policy["Properties"]["PolicyDocument"]["Statement"] if s.get("Sid") == "OnlyGrantedSendersMayIngest"
    ]
    own = [{"Fn::GetAtt": [_role(raw, h), "Arn"]} for h in (INGEST_HANDLER, TIMER_HANDLER)]
    assert deny["Condition"] == {"ArnNotLike": {"aws:PrincipalArn": [*own, "arn:aws:iam::111122223333:role/ops-*"]}}
    assert raw["Outputs"]["SenderLongDelayRoute"]["Value"] == "auto"
    _cfn_lint(path)


def test_with_no_sender_named_only_the_stacks_own_roles_may_send_to_the_ingest_queue(tier: Synth) -> None:
    # #23: until a sender was named, the ingest queue's policy held only the TLS Deny, so any principal of the account
    # with sqs:SendMessage could write ingest records (choosing the destination, the due time, the send time that
    # cancel records bind to). Now it is closed by default, as every -delay.fifo is.
    _, raw, _ = tier
    denials = _send_denials(raw)
    ingest = _logical_id(raw, "AWS::SQS::Queue", QueueName="delayed-delivery-ingest")
    own = [{"Fn::GetAtt": [_role(raw, h), "Arn"]} for h in (INGEST_HANDLER, TIMER_HANDLER)]
    assert denials[ingest] == [
        {
            "Sid": "OnlyGrantedSendersMayIngest",
            "Effect": "Deny",
            "Principal": {"AWS": "*"},
            "Action": "sqs:SendMessage",
            "Resource": {"Fn::GetAtt": [ingest, "Arn"]},
            "Condition": {"ArnNotLike": {"aws:PrincipalArn": own}},
        }
    ]
    delay_queues = [k for k, v in _resources(raw, "AWS::SQS::Queue").items() if v["Properties"].get("FifoQueue")]
    assert len(delay_queues) == 2  # orders and billing: each closed but to its own function
    for queue in delay_queues:
        [deny] = denials[queue]
        [allowed] = deny["Condition"]["ArnNotLike"]["aws:PrincipalArn"]
        assert deny["Effect"] == "Deny" and deny["Principal"] == {"AWS": "*"} and "Fn::GetAtt" in allowed
    for policy in _resources(raw, "AWS::SQS::QueuePolicy").values():  # nothing opens a queue to everyone
        statements = policy["Properties"]["PolicyDocument"]["Statement"]
        assert not [s for s in statements if s["Effect"] == "Allow" and s.get("Principal") in ("*", {"AWS": "*"})]


def test_grant_send_ingest_allows_a_role_and_bad_sizes_are_refused(tmp_path: Path) -> None:
    from aws_cdk import aws_iam as iam

    app = cdk.App(outdir=str(tmp_path / "cdk.out"), context={"endpoints": ["orders"], "longDelayRoute": "buckets"})
    stack = build(app)
    assert isinstance(stack.buckets, TimeBucketTier)
    sender = iam.Role(stack, "Sender", assumed_by=iam.ServicePrincipal("ecs-tasks.amazonaws.com"))
    stack.buckets.grant_send_ingest(sender)
    raw = json.loads(Path(app.synth().get_stack_artifact(stack.artifact_id).template_full_path).read_text())
    sender_id = _logical_id(raw, "AWS::IAM::Role", Description=None)
    ingest = _logical_id(raw, "AWS::SQS::Queue", QueueName="delayed-delivery-ingest")
    [policy] = [
        p for p in _resources(raw, "AWS::IAM::Policy").values() if p["Properties"]["Roles"] == [{"Ref": sender_id}]
    ]
    [statement] = policy["Properties"]["PolicyDocument"]["Statement"]
    assert "sqs:SendMessage" in statement["Action"] and statement["Resource"] == {"Fn::GetAtt": [ingest, "Arn"]}
    text = json.dumps(raw["Resources"])
    assert "OnlyGrantedSendersMayIngest" in text and sender_id in text
    with pytest.raises(TypeError, match="role"):
        stack.buckets.grant_send_ingest(iam.AccountRootPrincipal())
    for bad in (
        {"bucketCoarseSeconds": 90},
        {"bucketDispatchLeadSeconds": 880},
        {"bucketPrefix": "/x/"},
        {"bucketDispatchLeadSeconds": 600},  # the 300 s window would let a 901 s delay miss its first dispatch
        {"bucketIngestWindowSeconds": 301},
        {"maxNativeDelay": 600},
        {"bucketDispatchConcurrency": 1},
        {"bucketDispatchConcurrency": 1_001},
    ):
        with pytest.raises(ValueError):
            build(cdk.App(context={"endpoints": ["orders"], "longDelayRoute": "buckets", **bad}))
    # the old lead fits a shorter window
    context = {"bucketDispatchLeadSeconds": 600, "bucketIngestWindowSeconds": 120}
    custom = build(cdk.App(context={"endpoints": ["orders"], "longDelayRoute": "buckets", **context}))
    Template.from_stack(custom).has_resource_properties(
        "AWS::Lambda::EventSourceMapping", {"MaximumBatchingWindowInSeconds": 120}
    )


def test_the_functions_environment_is_what_the_tier_config_reads(tier: Synth) -> None:
    from delayed_delivery.aws.tier.config import BucketTierConfig

    _, raw, _ = tier
    for handler in (INGEST_HANDLER, TIMER_HANDLER, DISPATCH_HANDLER):
        env = _function(raw, handler)[1]["Properties"]["Environment"]["Variables"]
        resolved = {
            k: v if isinstance(v, str) else f"deployed-{k.lower()[-12:].replace('_', '-')}" for k, v in env.items()
        }
        config = BucketTierConfig.from_env(resolved)
        assert config.prefix == PREFIX and config.service == "delayed-delivery-buckets"
        assert config.sqs_settings.bucket_ingest_queue == "delayed-delivery-ingest"
        assert (config.tier_settings.bucket_fine_seconds, config.tier_settings.bucket_coarse_seconds) == (60, 86_400)
        assert config.tier_settings.bucket_dispatch_lead_seconds == 420  # covers the 300 s window (#24)
        assert config.cancellation_table is not None
        # #23: the functions know the tier's destinations (an ingest record naming another is refused) and how long
        # to retry a destination that refuses them
        assert config.destinations == frozenset({"orders", "billing"})
        assert config.tier_settings.bucket_refused_retry_seconds == 3600
        assert config.tier_settings.bucket_dispatch_queue and config.tier_settings.bucket_dispatch_concurrency == 32


def test_the_dispatch_queue_feeds_the_workers_a_task_at_a_time_at_the_set_concurrency(
    tier: Synth, tmp_path: Path
) -> None:
    template, raw, _ = tier
    dispatch = _dispatch(raw)
    queue = raw["Resources"][dispatch]["Properties"]
    name, function = _function(raw, DISPATCH_HANDLER)
    assert function["Properties"]["Timeout"] == 180 and function["Properties"]["MemorySize"] == 1769
    assert "ReservedConcurrentExecutions" not in function["Properties"]  # the event source caps it
    assert queue["VisibilityTimeout"] >= function["Properties"]["Timeout"]  # Lambda refuses less
    assert queue["SqsManagedSseEnabled"] is True and queue["RedrivePolicy"]["maxReceiveCount"] == 5
    [policy] = [
        p for p in _resources(raw, "AWS::SQS::QueuePolicy").values() if p["Properties"]["Queues"] == [{"Ref": dispatch}]
    ]
    assert any(
        st.get("Condition") == {"Bool": {"aws:SecureTransport": "false"}}
        for st in policy["Properties"]["PolicyDocument"]["Statement"]
    )
    template.has_resource_properties(
        "AWS::Lambda::EventSourceMapping",
        {
            "EventSourceArn": {"Fn::GetAtt": [dispatch, "Arn"]},
            "FunctionName": {"Ref": name},
            "BatchSize": 1,
            "FunctionResponseTypes": ["ReportBatchItemFailures"],
            "ScalingConfig": {"MaximumConcurrency": 32},
        },
    )
    _, wider, _ = _synth(
        tmp_path, {"endpoints": ["orders"], "longDelayRoute": "buckets", "bucketDispatchConcurrency": 12}
    )
    [mapping] = [m for m in _resources(wider, "AWS::Lambda::EventSourceMapping").values()
                 if m["Properties"]["BatchSize"] == 1]  # fmt: skip
    assert mapping["Properties"]["ScalingConfig"] == {"MaximumConcurrency": 12}
    env = _function(wider, DISPATCH_HANDLER)[1]["Properties"]["Environment"]["Variables"]
    assert env["DELAYED_DELIVERY_BUCKET_DISPATCH_CONCURRENCY"] == "12"
