"""Recurring schedules in the CDK app (context ``recurringSchedules``): the schedules table (kept, encrypted, PITR),
the timer Lambda on an every-minute rule, its least-privilege role, its error queue, alarms on missed occurrences
and timer failures, the dashboard rows, an asset carrying tzdata; cdk-nag (on synth) and cfn-lint clean."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.infra

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

from aws_cdk.assertions import Match, Template  # noqa: E402

from infra.aws.schedules import SCHEDULE_TIMER_HANDLER  # noqa: E402
from tests.infra.test_assets import assert_functions_use_their_assets  # noqa: E402
from tests.infra.test_aws_stack import _actions, _cfn_lint, _resources, _synth  # noqa: E402

Synth = tuple[Template, dict[str, Any], Path]


@pytest.fixture(scope="module")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    context = {"endpoints": ["orders", "billing"], "recurringSchedules": True, "releaseRates": {"orders": 50}}
    return _synth(tmp_path_factory.mktemp("schedules"), context)


def _timer(raw: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    [found] = [
        (k, v)
        for k, v in _resources(raw, "AWS::Lambda::Function").items()
        if v["Properties"]["Handler"] == SCHEDULE_TIMER_HANDLER
    ]
    return found


def _statements(raw: dict[str, Any], function: dict[str, Any]) -> list[dict[str, Any]]:
    role = function["Properties"]["Role"]["Fn::GetAtt"][0]
    [policy] = [p for p in _resources(raw, "AWS::IAM::Policy").values() if p["Properties"]["Roles"] == [{"Ref": role}]]
    statements: list[dict[str, Any]] = policy["Properties"]["PolicyDocument"]["Statement"]
    return statements


def test_the_table_is_kept_encrypted_and_keyed_by_pk_and_sk(synth: Synth) -> None:
    template, _, _ = synth
    template.has_resource(
        "AWS::DynamoDB::Table",
        {
            "Properties": Match.object_like(
                {
                    "TableName": "delayed-delivery-schedules",
                    "KeySchema": [
                        {"AttributeName": "pk", "KeyType": "HASH"},
                        {"AttributeName": "sk", "KeyType": "RANGE"},
                    ],
                    "BillingMode": "PAY_PER_REQUEST",
                    "SSESpecification": {"SSEEnabled": True},
                    "PointInTimeRecoverySpecification": {"PointInTimeRecoveryEnabled": True},
                }
            ),
            "DeletionPolicy": "Retain",
            "UpdateReplacePolicy": "Retain",
        },
    )


def test_the_timer_runs_every_minute_with_its_settings(synth: Synth) -> None:
    template, raw, _ = synth
    logical, function = _timer(raw)
    props = function["Properties"]
    assert props["MemorySize"] == 1769 and props["Timeout"] == 120 and props["ReservedConcurrentExecutions"] == 2
    env = props["Environment"]["Variables"]
    assert env["DELAYED_DELIVERY_SCHEDULE_LEAD_SECONDS"] == "300"
    assert env["DELAYED_DELIVERY_RELEASE_RATES"] == '{"orders":50}'
    assert env["POWERTOOLS_SERVICE_NAME"] == "delayed-delivery-schedules"
    assert "DELAYED_DELIVERY_SCHEDULE_TABLE" in env and "DELAYED_DELIVERY_ERROR_QUEUE" in env
    template.has_resource_properties(
        "AWS::Events::Rule",
        {
            "ScheduleExpression": "rate(1 minute)",
            "Targets": [Match.object_like({"Arn": {"Fn::GetAtt": [logical, "Arn"]}, "RetryPolicy": Match.any_value()})],
        },
    )


def test_the_timer_may_touch_only_its_table_its_destinations_and_its_error_queue(synth: Synth) -> None:
    _, raw, _ = synth
    _, function = _timer(raw)
    statements = _statements(raw, function)
    tables = {k for k, v in _resources(raw, "AWS::DynamoDB::Table").items() if "Schedules" in k}
    for s in statements:
        assert all(a != "*" and not a.endswith(":*") for a in _actions(s)), s
        if any(a.startswith("dynamodb:") for a in _actions(s)):
            resource = s["Resource"]
            if "Condition" in s:  # the release calendar: the destinations' partitions only
                assert s["Condition"]["ForAllValues:StringEquals"]["dynamodb:LeadingKeys"] == ["billing", "orders"]
                assert set(_actions(s)) == {"dynamodb:UpdateItem", "dynamodb:GetItem", "dynamodb:Query"}
            else:
                assert resource["Fn::GetAtt"][0] in tables
                assert "dynamodb:Scan" not in _actions(s) and "dynamodb:DeleteTable" not in _actions(s)
    sends = [s for s in statements if "sqs:SendMessage" in _actions(s)]
    queues = {_resource_of(s) for s in sends}
    names = {raw["Resources"][q]["Properties"]["QueueName"] for q in queues}
    assert names == {"orders", "billing", "delayed-delivery-schedules-errors"}


def _resource_of(statement: dict[str, Any]) -> str:
    resource = statement["Resource"]
    logical: str = resource["Fn::GetAtt"][0]
    return logical


def test_alarms_watch_missed_occurrences_failures_lateness_and_the_error_queue(synth: Synth) -> None:
    _, raw, _ = synth
    alarms = [a["Properties"] for a in _resources(raw, "AWS::CloudWatch::Alarm").values()]
    by_metric = {a.get("MetricName"): a for a in alarms if a.get("Namespace") == "DelayedDelivery"}
    missed = by_metric["ScheduleOccurrencesMissed"]
    assert missed["Threshold"] == 0 and missed["ComparisonOperator"] == "GreaterThanThreshold"
    assert missed["Dimensions"] == [{"Name": "service", "Value": "delayed-delivery-schedules"}]
    assert by_metric["ScheduleTimerFailures"]["EvaluationPeriods"] == 3
    assert by_metric["ScheduleLateness"]["Statistic"] == "Maximum"
    described = " ".join(a["AlarmDescription"] for a in alarms)
    assert "schedules' error queue" in described and "schedule timer function failed" in described


def test_the_dashboard_has_the_schedules_rows(synth: Synth) -> None:
    _, raw, _ = synth
    [dashboard] = _resources(raw, "AWS::CloudWatch::Dashboard").values()
    body = str(dashboard["Properties"]["DashboardBody"])
    assert "Recurring schedules" in body and "ScheduleOccurrencesMissed" in body and "ScheduleLateness" in body


def test_the_timer_asset_carries_tzdata_and_only_what_it_imports(synth: Synth) -> None:
    _, raw, path = synth
    assert_functions_use_their_assets(raw, path)
    _, function = _timer(raw)
    folder = path.parent / f"asset.{function['Properties']['Code']['S3Key'].removesuffix('.zip')}"
    assert (folder / "tzdata" / "zoneinfo" / "Europe" / "Berlin").is_file()
    assert (folder / "delayed_delivery" / "aws" / "schedules" / "timer.py").is_file()
    assert not (folder / "delayed_delivery" / "app").exists()


def test_cfn_lint_passes(synth: Synth) -> None:
    _cfn_lint(synth[2])


def test_without_the_context_there_are_no_schedules(tmp_path: Path) -> None:
    _, raw, _ = _synth(tmp_path, {"endpoints": ["orders"]})
    handlers = {f["Properties"]["Handler"] for f in _resources(raw, "AWS::Lambda::Function").values()}
    assert SCHEDULE_TIMER_HANDLER not in handlers
    assert not [k for k in _resources(raw, "AWS::DynamoDB::Table") if "Schedules" in k]
