"""The CDK stack, synthesized offline: the FIFO queue rules (DelaySeconds 900, retention >= 4 days, no redrive), the
event source, least-privilege IAM, the queue policies and the KMS option, alarms and dashboard
(``aws_cdk.assertions``), cdk-nag AwsSolutions on every synth, and cfn-lint on the template."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.infra

ROOT = Path(__file__).resolve().parents[2]
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

import aws_cdk as cdk  # noqa: E402
from aws_cdk.assertions import Match, Template  # noqa: E402

from infra.aws.app import build  # noqa: E402
from infra.aws.endpoint import HANDLER  # noqa: E402
from infra.aws.packaging import prepare_function_asset  # noqa: E402
from tests.fixtures.services import unavailable  # noqa: E402
from tests.infra.test_assets import assert_functions_use_their_assets  # noqa: E402


def _synth(tmp: Path, context: dict[str, Any]) -> tuple[Template, dict[str, Any], Path]:
    """The stack of ``context``; without the verify probe (tests/infra/test_aws_probe.py has it) and on the FIFO route
    (no time-bucket tier: tests/infra/test_aws_buckets.py has it, and the default ``auto`` deploys it) unless asked."""
    app = cdk.App(outdir=str(tmp / "cdk.out"), context={"verifyProbe": False, "longDelayRoute": "fifo", **context})
    stack = build(app)
    assembly = app.synth()  # cdk-nag runs here: an unacknowledged AwsSolutions finding raises
    path = Path(assembly.get_stack_artifact(stack.artifact_id).template_full_path)
    raw = json.loads(path.read_text())
    return Template.from_json(raw), raw, path


@pytest.fixture(scope="module")
def synth(tmp_path_factory: pytest.TempPathFactory) -> tuple[Template, dict[str, Any], Path]:
    return _synth(tmp_path_factory.mktemp("aws"), {"endpoints": ["orders"]})


def _resources(raw: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in raw["Resources"].items() if v["Type"] == kind}


def _logical_id(raw: dict[str, Any], kind: str, **props: Any) -> str:
    [found] = [
        k for k, v in _resources(raw, kind).items() if all(v["Properties"].get(p) == x for p, x in props.items())
    ]
    return found


def test_delay_queue_follows_the_fifo_queue_rules(synth: tuple[Template, dict[str, Any], Path]) -> None:
    template, _raw, _ = synth
    template.has_resource_properties(
        "AWS::SQS::Queue",
        {
            "QueueName": "orders-delay.fifo",
            "FifoQueue": True,
            "ContentBasedDeduplication": False,
            "DelaySeconds": 900,
            # ≥ the rules' 4 days: the SQS maximum, so parked messages have 10 days beyond the 4 kept free
            "MessageRetentionPeriod": 14 * 24 * 3600,
            "VisibilityTimeout": 180,
            "SqsManagedSseEnabled": True,
            "RedrivePolicy": Match.absent(),
        },
    )
    template.has_resource_properties("AWS::SQS::Queue", {"QueueName": "orders", "SqsManagedSseEnabled": True})


def test_every_queue_is_encrypted_and_refuses_plain_http(synth: tuple[Template, dict[str, Any], Path]) -> None:
    _, raw, _ = synth
    queues = _resources(raw, "AWS::SQS::Queue")
    assert len(queues) == 3
    assert all(q["Properties"].get("SqsManagedSseEnabled") is True for q in queues.values())
    guarded = set()
    for policy in _resources(raw, "AWS::SQS::QueuePolicy").values():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            if statement["Effect"] == "Deny" and statement["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}:
                guarded.update(q["Ref"] for q in policy["Properties"]["Queues"])
    assert guarded == set(queues)


def test_event_source_reports_partial_batch_failures(synth: tuple[Template, dict[str, Any], Path]) -> None:
    template, raw, _ = synth
    delay = _logical_id(raw, "AWS::SQS::Queue", QueueName="orders-delay.fifo")
    template.has_resource_properties(
        "AWS::Lambda::EventSourceMapping",
        {
            "BatchSize": 10,
            "FunctionResponseTypes": ["ReportBatchItemFailures"],
            "EventSourceArn": {"Fn::GetAtt": [delay, "Arn"]},
            "MaximumBatchingWindowInSeconds": Match.absent(),  # not supported for FIFO
        },
    )
    assert len(_resources(raw, "AWS::Lambda::EventSourceMapping")) == 1


def test_function_is_thin_configured_by_environment_and_traced(synth: tuple[Template, dict[str, Any], Path]) -> None:
    template, raw, _ = synth
    template.has_resource_properties(
        "AWS::Lambda::Function",
        {
            "Handler": "functions.aws.requeue.handler",
            "Runtime": "python3.13",
            "Timeout": 30,
            "TracingConfig": {"Mode": "Active"},
            "Layers": [Match.object_like({"Fn::Join": Match.any_value()})],
            "LoggingConfig": {"LogGroup": Match.any_value()},
            "Environment": {
                "Variables": Match.object_like(
                    {
                        "DELAYED_DELIVERY_ERROR_QUEUE": {
                            "Fn::GetAtt": [Match.string_like_regexp("Errors"), "QueueName"]
                        },
                        "DELAYED_DELIVERY_MAX_NATIVE_DELAY": "900",
                        "DELAYED_DELIVERY_FIFO_QUEUE_DELAY": "900",
                        "DELAYED_DELIVERY_MAX_PARK_SECONDS": "42600",
                        "DELAYED_DELIVERY_PARK_MAX_IN_FLIGHT": "100000",
                        "POWERTOOLS_SERVICE_NAME": "delayed-delivery-orders",
                        "POWERTOOLS_METRICS_NAMESPACE": "DelayedDelivery",
                    }
                )
            },
        },
    )
    layer = json.dumps(next(iter(_resources(raw, "AWS::Lambda::Function").values()))["Properties"]["Layers"])
    assert "017000801446:layer:AWSLambdaPowertoolsPythonV3-python313-x86_64:27" in layer
    template.has_resource_properties("AWS::Logs::LogGroup", {"RetentionInDays": 30})


def test_iam_is_scoped_to_the_endpoints_own_queues_and_log_group(synth: tuple[Template, dict[str, Any], Path]) -> None:
    _, raw, _ = synth
    queues = set(_resources(raw, "AWS::SQS::Queue"))
    delay = _logical_id(raw, "AWS::SQS::Queue", QueueName="orders-delay.fifo")
    [policy] = _resources(raw, "AWS::IAM::Policy").values()
    sends, reads, hides = set(), set(), set()
    dynamodb_statements: list[dict[str, Any]] = []
    for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        resource = statement["Resource"]
        if all(a.startswith("xray:") for a in actions):
            assert resource == "*"  # X-Ray has no resource-level permissions (acknowledged in code)
            continue
        assert resource != "*" and not any(a.endswith("*") for a in actions), statement
        if any(a.startswith("logs:") for a in actions):
            assert resource["Fn::GetAtt"][1] == "Arn" and "Logs" in resource["Fn::GetAtt"][0]
            continue
        if any(a.startswith("dynamodb:") for a in actions):
            dynamodb_statements.append(statement)
            continue
        target = resource["Fn::GetAtt"][0]
        assert target in queues
        if "sqs:SendMessage" in actions:
            sends.add(target)
        if "sqs:ReceiveMessage" in actions or "sqs:DeleteMessage" in actions:
            reads.add(target)
        if "sqs:ChangeMessageVisibility" in actions:
            hides.add(target)
    assert sends == queues  # its FIFO (requeue), its input queue (forward), its error queue
    assert reads == {delay}  # reads only its FIFO
    assert hides == {delay}  # parks only on its own FIFO
    # the cancellation table: read and delete records, only in its own endpoint's partition
    [table] = _resources(raw, "AWS::DynamoDB::Table")
    [records] = dynamodb_statements
    assert sorted(records["Action"]) == ["dynamodb:DeleteItem", "dynamodb:Query"]
    assert records["Resource"] == {"Fn::GetAtt": [table, "Arn"]}
    assert records["Condition"] == {"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": ["orders"]}}
    [role] = _resources(raw, "AWS::IAM::Role").values()
    assert "ManagedPolicyArns" not in role["Properties"]


def test_cancellation_table_is_on_demand_encrypted_recoverable_with_ttl(
    synth: tuple[Template, dict[str, Any], Path],
) -> None:
    template, raw, _ = synth
    template.has_resource_properties(
        "AWS::DynamoDB::Table",
        {
            "TableName": "delayed-delivery-cancellations",
            "BillingMode": "PAY_PER_REQUEST",
            "KeySchema": [
                {"AttributeName": "endpoint", "KeyType": "HASH"},
                {"AttributeName": "message_id", "KeyType": "RANGE"},
            ],
            "TimeToLiveSpecification": {"AttributeName": "expires_at", "Enabled": True},
            "SSESpecification": {"SSEEnabled": True},
            "PointInTimeRecoverySpecification": {"PointInTimeRecoveryEnabled": True},
        },
    )
    [table] = _resources(raw, "AWS::DynamoDB::Table")
    template.has_resource_properties(
        "AWS::Lambda::Function",
        {
            "Environment": {
                "Variables": Match.object_like(
                    {
                        "DELAYED_DELIVERY_CANCELLATION_TABLE": {"Ref": table},
                        "DELAYED_DELIVERY_CANCELLATION_CACHE_SECONDS": "60",
                    }
                )
            }
        },
    )
    assert "CancellationTable" in raw["Outputs"]


def test_alarms_and_dashboard(synth: tuple[Template, dict[str, Any], Path]) -> None:
    _template, raw, _ = synth
    delay = _logical_id(raw, "AWS::SQS::Queue", QueueName="orders-delay.fifo")
    errors = _logical_id(raw, "AWS::SQS::Queue", MessageRetentionPeriod=14 * 24 * 3600, QueueName=None)
    alarms = {
        (a["Properties"]["MetricName"], json.dumps(a["Properties"].get("Dimensions"))): a["Properties"]
        for a in _resources(raw, "AWS::CloudWatch::Alarm").values()
    }
    assert len(alarms) == 3
    [error_queue] = [a for (m, d), a in alarms.items() if m == "ApproximateNumberOfMessagesVisible" and errors in d]
    assert error_queue["Threshold"] == 1
    assert [m for m, _ in alarms].count("Errors") == 1
    # Falling behind: a backlog of ready messages on the FIFO queue that does not drain for 5 minutes. Not the age
    # of the oldest message, which counts a parked (in-flight) message's 12 hours.
    [behind] = [a for (m, d), a in alarms.items() if m == "ApproximateNumberOfMessagesVisible" and delay in d]
    assert behind["Dimensions"][0]["Value"] == {"Fn::GetAtt": [delay, "QueueName"]}
    assert (behind["Statistic"], behind["Period"], behind["EvaluationPeriods"]) == ("Minimum", 60, 5)
    assert behind["Threshold"] == 1000
    assert all(m != "ApproximateAgeOfOldestMessage" for m, _ in alarms)
    [dashboard] = _resources(raw, "AWS::CloudWatch::Dashboard").values()
    body = json.dumps(dashboard["Properties"]["DashboardBody"])
    for metric in (
        "Requeued",
        "Forwarded",
        "Parked",
        "ApproximateNumberOfMessagesNotVisible",
        "ErrorQueueForwards",
        "RemainingDelay",
        "ApproximateAgeOfOldestMessage",
        "Cancelled",
        "Rescheduled",
        "CancellationLookupFailures",
    ):
        assert metric in body


def _cfn_lint(path: Path) -> None:
    """cfn-lint on the template, every match (error, warning, informational) a failure; through its API in this
    process, so its rules load once per test process instead of once per template (a process each cost about 5 s)."""
    from cfnlint.api import ManualArgs, lint_file

    matches = lint_file(path, config=ManualArgs(ignore_checks=["W3005"]))
    assert not matches, "\n".join(str(m) for m in matches)


def test_cfn_lint_passes(synth: tuple[Template, dict[str, Any], Path]) -> None:
    _, _, path = synth
    _cfn_lint(path)


def _send_denials(raw: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Queue logical id -> its policy's Deny statements on sqs:SendMessage."""
    found: dict[str, list[dict[str, Any]]] = {}
    for policy in _resources(raw, "AWS::SQS::QueuePolicy").values():
        statements = policy["Properties"]["PolicyDocument"]["Statement"]
        denials = [s for s in statements if s["Effect"] == "Deny" and s["Action"] == "sqs:SendMessage"]
        for queue in policy["Properties"]["Queues"]:
            found.setdefault(queue["Ref"], []).extend(denials)
    return found


def test_only_the_function_may_send_to_its_delay_queue_by_default(
    synth: tuple[Template, dict[str, Any], Path],
) -> None:
    _, raw, _ = synth
    delay = _logical_id(raw, "AWS::SQS::Queue", QueueName="orders-delay.fifo")
    [function] = _resources(raw, "AWS::Lambda::Function").values()
    role = function["Properties"]["Role"]["Fn::GetAtt"][0]
    denials = _send_denials(raw)
    assert denials[delay] == [
        {
            "Sid": "OnlyGrantedSendersMayDelay",
            "Effect": "Deny",
            "Principal": {"AWS": "*"},
            "Action": "sqs:SendMessage",
            "Resource": {"Fn::GetAtt": [delay, "Arn"]},
            "Condition": {"ArnNotLike": {"aws:PrincipalArn": [{"Fn::GetAtt": [role, "Arn"]}]}},
        }
    ]
    assert all(not d for q, d in denials.items() if q != delay), "the input and error queues keep their own rules"


def test_grant_send_delayed_exempts_and_allows_the_sender(tmp_path: Path) -> None:
    from aws_cdk import aws_iam as iam

    app = cdk.App(outdir=str(tmp_path / "cdk.out"), context={"endpoints": ["orders"], "longDelayRoute": "fifo"})
    stack = build(app)
    sender = iam.Role(stack, "Sender", assumed_by=iam.ServicePrincipal("ecs-tasks.amazonaws.com"))
    [endpoint] = stack.endpoints
    endpoint.grant_send_delayed(sender)
    raw = json.loads(Path(app.synth().get_stack_artifact(stack.artifact_id).template_full_path).read_text())
    delay = _logical_id(raw, "AWS::SQS::Queue", QueueName="orders-delay.fifo")
    sender_id = _logical_id(raw, "AWS::IAM::Role", Description=None)
    [denial] = _send_denials(raw)[delay]
    allowed = denial["Condition"]["ArnNotLike"]["aws:PrincipalArn"]
    assert {"Fn::GetAtt": [sender_id, "Arn"]} in allowed and len(allowed) == 2
    [policy] = [
        p for p in _resources(raw, "AWS::IAM::Policy").values() if p["Properties"]["Roles"][0]["Ref"] == sender_id
    ]
    [statement] = policy["Properties"]["PolicyDocument"]["Statement"]
    assert "sqs:SendMessage" in statement["Action"] and statement["Resource"] == {"Fn::GetAtt": [delay, "Arn"]}
    with pytest.raises(TypeError, match="role"):
        endpoint.grant_send_delayed(iam.AccountRootPrincipal())


LEGACY_ARN = "arn:aws:sqs:us-east-1:111122223333:legacy"
LEGACY_KEY = "arn:aws:kms:us-east-1:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab"


def test_customer_managed_key_encrypts_the_queues_and_is_granted_exactly(tmp_path: Path) -> None:
    legacy = {"name": "legacy", "existingQueueArn": LEGACY_ARN, "existingQueueKeyArn": LEGACY_KEY}
    legacy["senders"] = ["arn:aws:iam::111122223333:role/legacy-app"]  # type: ignore[assignment]
    template, raw, path = _synth(
        tmp_path,
        {
            "endpoints": json.dumps(["orders", legacy]),
            "kmsKey": "create",
            "delaySenders": "arn:aws:iam::111122223333:role/ops-*",
        },
    )
    [key] = _resources(raw, "AWS::KMS::Key")
    template.has_resource_properties("AWS::KMS::Key", {"EnableKeyRotation": True})
    queues = _resources(raw, "AWS::SQS::Queue")
    assert len(queues) == 5  # orders, and a delay and an error queue per endpoint
    for queue in queues.values():
        assert queue["Properties"]["KmsMasterKeyId"] == {"Fn::GetAtt": [key, "Arn"]}
        assert "SqsManagedSseEnabled" not in queue["Properties"]
    policies = {
        p["Properties"]["Roles"][0]["Ref"]: p["Properties"]["PolicyDocument"]["Statement"]
        for p in _resources(raw, "AWS::IAM::Policy").values()
    }
    assert len(policies) == 2
    for statements in policies.values():
        kms = [s for s in statements if any(a.startswith("kms:") for a in _actions(s))]
        assert all(not a.endswith("*") for s in statements for a in _actions(s) if not a.startswith("xray:"))
        own = [s for s in kms if s["Resource"] == {"Fn::GetAtt": [key, "Arn"]}]
        assert {a for s in own for a in _actions(s)} == {"kms:Decrypt", "kms:GenerateDataKey"}
    [legacy_role] = [r for r, st in policies.items() if LEGACY_ARN in json.dumps(st)]
    [imported] = [s for s in policies[legacy_role] if s["Resource"] == LEGACY_KEY]
    assert sorted(_actions(imported)) == ["kms:Decrypt", "kms:GenerateDataKey"]  # sends to the adopted queue
    legacy_delay = _logical_id(raw, "AWS::SQS::Queue", QueueName="legacy-delay.fifo")
    [denial] = _send_denials(raw)[legacy_delay]
    assert denial["Condition"]["ArnNotLike"]["aws:PrincipalArn"] == [
        {"Fn::GetAtt": [legacy_role, "Arn"]},
        "arn:aws:iam::111122223333:role/ops-*",
        "arn:aws:iam::111122223333:role/legacy-app",
    ]
    _cfn_lint(path)


def test_an_imported_key_is_used_by_arn(tmp_path: Path) -> None:
    _, raw, _ = _synth(tmp_path, {"endpoints": ["orders"], "kmsKey": LEGACY_KEY})
    assert not _resources(raw, "AWS::KMS::Key")
    assert {q["Properties"]["KmsMasterKeyId"] for q in _resources(raw, "AWS::SQS::Queue").values()} == {LEGACY_KEY}
    with pytest.raises(ValueError, match="kms_key"):
        _synth(tmp_path / "bad", {"endpoints": ["orders"], "kmsKey": "alias/mine"})


def _actions(statement: dict[str, Any]) -> list[str]:
    action = statement["Action"]
    return action if isinstance(action, list) else [action]


def test_several_endpoints_and_an_existing_input_queue(tmp_path: Path) -> None:
    arn = "arn:aws:sqs:us-east-1:111122223333:legacy"
    template, raw, _ = _synth(
        tmp_path,
        {
            "endpoints": json.dumps(["orders", {"name": "legacy", "existingQueueArn": arn}]),
            "fifoQueueDelay": 600,
            "maxParkSeconds": 0,
        },
    )
    template.has_resource_properties(  # parking off by context
        "AWS::Lambda::Function",
        {"Environment": {"Variables": Match.object_like({"DELAYED_DELIVERY_MAX_PARK_SECONDS": "0"})}},
    )
    names = {q["Properties"].get("QueueName") for q in _resources(raw, "AWS::SQS::Queue").values()}
    assert {"orders", "orders-delay.fifo", "legacy-delay.fifo"} <= names and "legacy" not in names
    assert len(_resources(raw, "AWS::Lambda::Function")) == 2
    template.has_resource_properties("AWS::SQS::Queue", {"QueueName": "legacy-delay.fifo", "DelaySeconds": 600})
    policies = json.dumps(list(_resources(raw, "AWS::IAM::Policy").values()))
    assert arn in policies  # the legacy function may send to the adopted queue...
    [legacy_policy] = [p for p in _resources(raw, "AWS::IAM::Policy").values() if arn in json.dumps(p)]
    orders = _logical_id(raw, "AWS::SQS::Queue", QueueName="orders")
    assert orders not in json.dumps(legacy_policy)  # ...and to nothing of the other endpoint
    assert '"dynamodb:LeadingKeys": ["legacy"]' in json.dumps(legacy_policy)  # its own partition of the one table
    assert len(_resources(raw, "AWS::DynamoDB::Table")) == 1


def test_cdk_nag_is_live_an_unencrypted_queue_fails_synth(tmp_path: Path) -> None:
    from aws_cdk import aws_sqs as sqs
    from cdk_nag import AwsSolutionsChecks

    app = cdk.App(outdir=str(tmp_path))
    stack = cdk.Stack(app, "Bad")
    sqs.Queue(stack, "Plain", encryption=sqs.QueueEncryption.UNENCRYPTED)
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    with pytest.raises(RuntimeError, match="ValidationFailed") as failure:
        app.synth()
    assert "AwsSolutions-SQS2" in str(failure.value)  # server-side encryption


def test_function_asset_holds_only_the_function_code(tmp_path: Path) -> None:
    asset = prepare_function_asset([HANDLER], tmp_path / "asset")
    assert (asset / "functions" / "aws" / "requeue.py").exists()
    assert (asset / "delayed_delivery" / "aws" / "requeue" / "__init__.py").exists()
    for excluded in ("azure", "postgres", "pipelines", "testing", "app", "aws/tier"):
        assert not (asset / "delayed_delivery" / excluded).exists()
    assert not list(asset.rglob("__pycache__"))


def test_each_function_runs_from_the_asset_made_for_its_handler(
    synth: tuple[Template, dict[str, Any], Path],
) -> None:
    _, raw, path = synth
    assert_functions_use_their_assets(raw, path)


def test_real_cdk_cli_synth_offline(tmp_path: Path) -> None:
    if not (ROOT / "node_modules" / ".bin" / "cdk").exists():
        unavailable("the pinned CDK CLI is not installed (npm ci)")  # skipped locally, a failure in CI
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
        "CDK_DISABLE_VERSION_CHECK": "1",
        "CDK_DISABLE_CLI_TELEMETRY": "true",
    }
    result = subprocess.run(
        [
            str(ROOT / "node_modules" / ".bin" / "cdk"),
            "synth",
            "--no-notices",
            "--no-version-reporting",
            "-q",
            "--output",
            str(tmp_path / "out"),
        ],
        cwd=ROOT / "infra" / "aws",
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert (tmp_path / "out" / "DelayedDelivery.template.json").exists()
