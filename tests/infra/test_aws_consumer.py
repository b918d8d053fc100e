"""The example consumer in the CDK app: absent by default; with ``exampleConsumer`` a Lambda on each input queue
(SQS event source, partial batch responses, Powertools layer), its own least-privilege role, cdk-nag and cfn-lint
clean."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.infra

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

import aws_cdk as cdk  # noqa: E402
from aws_cdk.assertions import Match, Template  # noqa: E402

from infra.aws.app import build  # noqa: E402
from infra.aws.consumer import CONSUMER_HANDLER  # noqa: E402
from infra.aws.packaging import prepare_function_asset  # noqa: E402
from tests.infra.test_assets import assert_functions_use_their_assets  # noqa: E402
from tests.infra.test_aws_stack import _cfn_lint, _logical_id, _resources, _synth  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def with_consumer(tmp_path_factory: pytest.TempPathFactory) -> tuple[Template, dict[str, Any], Path]:
    return _synth(tmp_path_factory.mktemp("consumer"), {"endpoints": ["orders", "billing"], "exampleConsumer": True})


def _consumers(raw: dict[str, Any]) -> dict[str, dict[str, Any]]:
    functions = _resources(raw, "AWS::Lambda::Function")
    return {k: v for k, v in functions.items() if v["Properties"]["Handler"] == CONSUMER_HANDLER}


def test_absent_by_default(tmp_path: Path) -> None:
    for context in ({"endpoints": ["orders"]}, {"endpoints": ["orders"], "exampleConsumer": "false"}):
        _, raw, _ = _synth(tmp_path / str(len(context)), context)
        assert _consumers(raw) == {}
        assert len(_resources(raw, "AWS::Lambda::EventSourceMapping")) == 1, "the requeue function's only"


def test_a_lambda_reads_each_input_queue(with_consumer: tuple[Template, dict[str, Any], Path]) -> None:
    template, raw, _ = with_consumer
    consumers = _consumers(raw)
    assert len(consumers) == 2
    for name in ("orders", "billing"):
        queue = _logical_id(raw, "AWS::SQS::Queue", QueueName=name)
        template.has_resource_properties(
            "AWS::Lambda::EventSourceMapping",
            {
                "BatchSize": 10,
                "FunctionResponseTypes": ["ReportBatchItemFailures"],
                "EventSourceArn": {"Fn::GetAtt": [queue, "Arn"]},
                "FunctionName": {"Ref": Match.string_like_regexp(f"ExampleConsumer{name}")},
            },
        )
    template.has_resource_properties(
        "AWS::Lambda::Function",
        {
            "Handler": CONSUMER_HANDLER,
            "Runtime": "python3.13",
            "TracingConfig": {"Mode": "Active"},
            "Layers": [Match.object_like({"Fn::Join": Match.any_value()})],
            "LoggingConfig": {"LogGroup": Match.any_value()},
            "Environment": {
                "Variables": Match.object_like(
                    {
                        "POWERTOOLS_SERVICE_NAME": "delayed-delivery-consumer-orders",
                        "POWERTOOLS_METRICS_NAMESPACE": "DelayedDelivery",
                    }
                )
            },
        },
    )
    assert len(_resources(raw, "AWS::Lambda::EventSourceMapping")) == 4  # two requeue functions, two consumers


def test_the_consumer_role_reads_its_queue_uses_its_table_and_writes_its_log_group_only(
    with_consumer: tuple[Template, dict[str, Any], Path],
) -> None:
    _, raw, _ = with_consumer
    tables: set[str] = set()
    for logical, function in _consumers(raw).items():
        role = function["Properties"]["Role"]["Fn::GetAtt"][0]
        queue_name = function["Properties"]["Environment"]["Variables"]["POWERTOOLS_SERVICE_NAME"].rsplit("-", 1)[1]
        queue = _logical_id(raw, "AWS::SQS::Queue", QueueName=queue_name)
        [policy] = [
            p for p in _resources(raw, "AWS::IAM::Policy").values() if p["Properties"]["Roles"] == [{"Ref": role}]
        ]
        actions: set[str] = set()
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            found = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            if all(a.startswith("xray:") for a in found):
                assert statement["Resource"] == "*"
                continue
            assert not any(a.endswith("*") for a in found), statement
            if any(a.startswith("logs:") for a in found):
                assert "ExampleConsumer" in statement["Resource"]["Fn::GetAtt"][0], logical
                continue
            if any(a.startswith("dynamodb:") for a in found):
                table = function["Properties"]["Environment"]["Variables"]["IDEMPOTENCY_TABLE"]["Ref"]
                assert sorted(found) == [
                    "dynamodb:DeleteItem",
                    "dynamodb:GetItem",
                    "dynamodb:PutItem",
                    "dynamodb:UpdateItem",
                ]
                assert {"Fn::GetAtt": [table, "Arn"]} in (
                    statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
                )
                tables.add(table)
                continue
            assert statement["Resource"] == {"Fn::GetAtt": [queue, "Arn"]}, statement
            actions.update(found)
        assert "sqs:ReceiveMessage" in actions and "sqs:DeleteMessage" in actions
        assert "sqs:SendMessage" not in actions, "the example only reads"
        assert "ManagedPolicyArns" not in raw["Resources"][role]["Properties"]
    assert len(tables) == 2, "each consumer has its own idempotency table"
    for table in tables:
        properties = raw["Resources"][table]["Properties"]
        assert properties["KeySchema"] == [{"AttributeName": "id", "KeyType": "HASH"}]  # what Powertools expects
        assert properties["TimeToLiveSpecification"] == {"AttributeName": "expiration", "Enabled": True}
        assert properties["BillingMode"] == "PAY_PER_REQUEST"


def test_cfn_lint_passes_with_the_consumer(with_consumer: tuple[Template, dict[str, Any], Path]) -> None:
    _cfn_lint(with_consumer[2])


def test_the_consumer_ships_in_its_function_asset(tmp_path: Path) -> None:
    asset = prepare_function_asset([CONSUMER_HANDLER], tmp_path / "asset")
    assert (asset / "functions" / "aws" / "consumer.py").read_text() == (
        ROOT / "functions" / "aws" / "consumer.py"
    ).read_text()
    assert not (asset / "functions" / "aws" / "requeue.py").exists()


def test_the_consumer_runs_from_its_own_asset(with_consumer: tuple[Template, dict[str, Any], Path]) -> None:
    _, raw, path = with_consumer
    assert_functions_use_their_assets(raw, path)


def test_a_bad_flag_is_refused(tmp_path: Path) -> None:
    app = cdk.App(outdir=str(tmp_path / "out"), context={"endpoints": ["orders"], "exampleConsumer": "yes"})
    with pytest.raises(ValueError, match="exampleConsumer"):
        build(app)
