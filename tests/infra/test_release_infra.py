"""Release control in the infrastructure: the CDK stack and the Bicep template take the same ``release_rates`` option
and each puts an alarm on the release lag (synthesized offline; the Bicep checked as text)."""

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

from delayed_delivery.aws.config import RELEASE_TABLE_ENV  # noqa: E402
from delayed_delivery.release import RELEASE_RATES_ENV, ReleaseRates  # noqa: E402
from infra.aws.app import build  # noqa: E402
from tests.infra.test_aws_stack import _cfn_lint  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RATES = {"orders": 200, "*": 1000, "audit": None}


def _synth(tmp: Path, context: dict[str, Any]) -> tuple[Template, dict[str, Any], Path]:
    app = cdk.App(outdir=str(tmp / "cdk.out"), context={"verifyProbe": False, **context})
    stack = build(app)
    assembly = app.synth()  # cdk-nag runs here
    path = Path(assembly.get_stack_artifact(stack.artifact_id).template_full_path)
    raw = json.loads(path.read_text())
    return Template.from_json(raw), raw, path


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Template, dict[str, Any], Path]:
    context = {"endpoints": ["orders", "audit"], "releaseRates": json.dumps(RATES), "releaseLagAlarmSeconds": 120}
    return _synth(tmp_path_factory.mktemp("release"), context)


def _functions(raw: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        k: v["Properties"]
        for k, v in raw["Resources"].items()
        if v["Type"] == "AWS::Lambda::Function" and "Requeue" in k
    }


def test_the_capped_endpoint_gets_the_rates_the_table_and_its_own_partition_only(
    capped: tuple[Template, dict[str, Any], Path],
) -> None:
    template, raw, _ = capped
    template.has_resource_properties(
        "AWS::DynamoDB::Table",
        {
            "KeySchema": [
                {"AttributeName": "destination", "KeyType": "HASH"},
                {"AttributeName": "second", "KeyType": "RANGE"},
            ],
            "BillingMode": "PAY_PER_REQUEST",
            "TimeToLiveSpecification": {"AttributeName": "expires_at", "Enabled": True},
        },
    )
    envs = {k: f["Environment"]["Variables"] for k, f in _functions(raw).items()}
    [orders] = [e for k, e in envs.items() if "orders" in k.lower()]
    [audit] = [e for k, e in envs.items() if "audit" in k.lower()]
    assert ReleaseRates.parse(orders[RELEASE_RATES_ENV]) == ReleaseRates.of(RATES), "the same option, as JSON"
    assert RELEASE_TABLE_ENV in orders
    assert RELEASE_RATES_ENV not in audit, "null lifts the default: the audit endpoint is not capped"
    template.has_resource_properties(
        "AWS::IAM::Policy",
        Match.object_like(
            {
                "PolicyDocument": {
                    "Statement": Match.array_with(
                        [
                            Match.object_like(
                                {
                                    "Action": ["dynamodb:UpdateItem", "dynamodb:GetItem", "dynamodb:Query"],
                                    "Condition": {"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": ["orders"]}},
                                }
                            )
                        ]
                    )
                }
            }
        ),
    )


def test_an_alarm_fires_when_the_release_lag_passes_its_threshold(
    capped: tuple[Template, dict[str, Any], Path],
) -> None:
    template, raw, _ = capped
    template.has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {
            "MetricName": "ReleaseLag",
            "Statistic": "Maximum",
            "Threshold": 120,
            "Dimensions": [{"Name": "service", "Value": "delayed-delivery-orders"}],
            "ComparisonOperator": "GreaterThanThreshold",
        },
    )
    alarms = [v["Properties"] for v in raw["Resources"].values() if v["Type"] == "AWS::CloudWatch::Alarm"]
    services = sorted(a["Dimensions"][0]["Value"] for a in alarms if a.get("MetricName") == "ReleaseLag")
    # only the capped endpoint (not audit), and the time-bucket tier beside it (the default route "auto" has one)
    assert services == ["delayed-delivery-buckets", "delayed-delivery-orders"]


def test_the_capped_template_passes_cfn_lint(capped: tuple[Template, dict[str, Any], Path]) -> None:
    _cfn_lint(capped[2])


def test_without_release_rates_there_is_no_table_and_no_setting(tmp_path: Path) -> None:
    _, raw, _ = _synth(tmp_path, {"endpoints": ["orders"]})
    assert not [
        v for v in raw["Resources"].values() if v["Type"] == "AWS::DynamoDB::Table" and "ReleaseSlots" in str(v)
    ]
    for function in _functions(raw).values():
        assert RELEASE_RATES_ENV not in function["Environment"]["Variables"]


@pytest.fixture(scope="module")
def tier(tmp_path_factory: pytest.TempPathFactory) -> tuple[Template, dict[str, Any], Path]:
    context = {
        "endpoints": ["orders"],
        "longDelayRoute": "buckets",
        "releaseRates": json.dumps({"orders": 200}),
        "releaseLagAlarmSeconds": 90,
    }
    return _synth(tmp_path_factory.mktemp("tier"), context)


def test_the_tier_takes_the_same_option_on_its_timer_and_dispatch_workers(
    tier: tuple[Template, dict[str, Any], Path],
) -> None:
    template, raw, _ = tier
    tier = {
        k: v["Properties"]["Environment"]["Variables"]
        for k, v in raw["Resources"].items()
        if v["Type"] == "AWS::Lambda::Function" and k.startswith("TimeBuckets") and "Ingest" not in k
    }
    assert len(tier) >= 2, sorted(tier)  # the timer and the dispatch workers
    for env in tier.values():
        assert ReleaseRates.parse(env[RELEASE_RATES_ENV]) == ReleaseRates.of({"orders": 200})
        assert RELEASE_TABLE_ENV in env
    template.has_resource_properties(
        "AWS::IAM::Policy",
        Match.object_like(
            {
                "PolicyDocument": {
                    "Statement": Match.array_with(
                        [
                            Match.object_like(
                                {
                                    "Action": ["dynamodb:UpdateItem", "dynamodb:GetItem", "dynamodb:Query"],
                                    "Condition": {
                                        "ForAllValues:StringEquals": {
                                            "dynamodb:LeadingKeys": Match.array_with(["orders"])
                                        }
                                    },
                                }
                            )
                        ]
                    )
                }
            }
        ),
    )


def test_the_tier_has_its_own_release_lag_alarm(tier: tuple[Template, dict[str, Any], Path]) -> None:
    template, raw, _ = tier
    template.has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {
            "MetricName": "ReleaseLag",
            "Namespace": "DelayedDelivery",
            "Statistic": "Maximum",
            "Period": 300,
            "Threshold": 90,
            "Dimensions": [{"Name": "service", "Value": "delayed-delivery-buckets"}],
            "ComparisonOperator": "GreaterThanThreshold",
            "TreatMissingData": "notBreaching",
        },
    )
    alarms = {k: v["Properties"] for k, v in raw["Resources"].items() if v["Type"] == "AWS::CloudWatch::Alarm"}
    lag = {k: a["Dimensions"][0]["Value"] for k, a in alarms.items() if a.get("MetricName") == "ReleaseLag"}
    [name] = [k for k, service in lag.items() if service == "delayed-delivery-buckets"]
    assert name.startswith("TimeBucketsReleaseLagHigh")
    assert sorted(lag.values()) == ["delayed-delivery-buckets", "delayed-delivery-orders"]  # the endpoint keeps its own


def test_the_tier_without_release_rates_has_no_release_lag_alarm(tmp_path: Path) -> None:
    _, raw, _ = _synth(tmp_path, {"endpoints": ["orders"], "longDelayRoute": "buckets"})
    alarms = [v["Properties"] for v in raw["Resources"].values() if v["Type"] == "AWS::CloudWatch::Alarm"]
    assert alarms and not [a for a in alarms if a.get("MetricName") == "ReleaseLag"]


@pytest.mark.parametrize("bad", ['{"orders": 0}', '{"orders": "fast"}', "[1]"])
def test_a_bad_release_rates_context_fails_the_synth_with_the_reason(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ValueError, match="releaseRates"):
        _synth(tmp_path, {"endpoints": ["orders"], "releaseRates": bad})


def test_the_bicep_template_takes_the_same_option_and_alerts_on_the_lag() -> None:
    main = (ROOT / "infra/azure/main.bicep").read_text()
    assert "param releaseRates object = {}" in main
    assert f"{RELEASE_RATES_ENV}: string(releaseRates)" in main
    assert "releaseLagSeconds: releaseLagAlertSeconds" in main
    operations = (ROOT / "infra/azure/modules/operations.bicep").read_text()
    assert "name: 'release-lag'" in operations and "threshold: releaseLagSeconds" in operations
    query = (ROOT / "infra/azure/queries/alert_release_lag.kql").read_text()
    assert 'name == "delayed_delivery.release_lag"' in query, "the histogram the dispatcher records (telemetry.py)"
