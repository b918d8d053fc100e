"""The verify probe endpoint in the CDK app (on by default): its queues follow the FIFO queue rules, it costs nothing
while idle (no alarm, its event source off), it is a destination of the tier, the roles that run verify may send to
it and to the ingest queue, the stack names it in an output; cdk-nag (on synth) and cfn-lint pass."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.infra.test_aws_stack import _cfn_lint, _logical_id, _resources, _send_denials, _synth

pytestmark = pytest.mark.infra

PROBE = "delayed-delivery-probe"
VERIFIER = "arn:aws:iam::111122223333:role/verifier"
Synth = tuple[Any, dict[str, Any], Path]


@pytest.fixture(scope="module")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    context = {"verifyProbe": True, "longDelayRoute": "buckets", "verifyRoles": [VERIFIER]}
    return _synth(tmp_path_factory.mktemp("probe"), context)


def _probe_function(raw: dict[str, Any]) -> str:
    [found] = [
        k
        for k, v in _resources(raw, "AWS::Lambda::Function").items()
        if v["Properties"]["Environment"]["Variables"].get("POWERTOOLS_SERVICE_NAME") == f"delayed-delivery-{PROBE}"
    ]
    return found


def test_the_probe_endpoint_follows_the_fifo_queue_rules_and_is_named_in_an_output(synth: Synth) -> None:
    template, raw, _ = synth
    template.has_resource_properties(
        "AWS::SQS::Queue",
        {"QueueName": f"{PROBE}-delay.fifo", "FifoQueue": True, "DelaySeconds": 900, "VisibilityTimeout": 180},
    )
    template.has_resource_properties("AWS::SQS::Queue", {"QueueName": PROBE, "SqsManagedSseEnabled": True})
    assert raw["Outputs"]["ProbeQueue"]["Value"] == PROBE


def test_the_probe_costs_nothing_while_idle(synth: Synth) -> None:
    _, raw, _ = synth
    function = _probe_function(raw)
    mappings = {
        v["Properties"]["FunctionName"]["Ref"]: v["Properties"]
        for v in _resources(raw, "AWS::Lambda::EventSourceMapping").values()
    }
    assert mappings[function]["Enabled"] is False, "its long polls would be billed requests: verify switches it on"
    assert mappings[function]["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    others = [m for f, m in mappings.items() if f != function]
    assert others and all(m.get("Enabled", True) is not False for m in others), "only the probe's is off"
    probe_ids = {k for k in raw["Resources"] if k.startswith("VerifyProbe")}
    alarms = json.dumps(_resources(raw, "AWS::CloudWatch::Alarm"))
    assert probe_ids and not any(k in alarms for k in probe_ids), "an alarm is billed every month"
    assert "ProvisionedConcurrencyConfig" not in json.dumps(raw["Resources"][function])


def test_the_probe_is_a_destination_of_the_tier(synth: Synth) -> None:
    _, raw, _ = synth
    probe_queue = _logical_id(raw, "AWS::SQS::Queue", QueueName=PROBE)
    [timer] = [
        k
        for k, v in _resources(raw, "AWS::Lambda::Function").items()
        if v["Properties"]["Handler"] == "functions.aws.bucket_timer.handler"
    ]
    role = raw["Resources"][timer]["Properties"]["Role"]["Fn::GetAtt"][0]
    [policy] = [p for p in _resources(raw, "AWS::IAM::Policy").values() if p["Properties"]["Roles"] == [{"Ref": role}]]
    sends = [s for s in policy["Properties"]["PolicyDocument"]["Statement"] if "sqs:SendMessage" in s["Action"]]
    assert any(s["Resource"] == {"Fn::GetAtt": [probe_queue, "Arn"]} for s in sends), sends


def test_the_roles_running_verify_may_send_to_the_probe_and_the_ingest_queue(synth: Synth) -> None:
    _, raw, _ = synth
    denials = _send_denials(raw)
    for name in (f"{PROBE}-delay.fifo", "delayed-delivery-ingest"):
        [deny] = denials[_logical_id(raw, "AWS::SQS::Queue", QueueName=name)]
        assert VERIFIER in deny["Condition"]["ArnNotLike"]["aws:PrincipalArn"], (name, deny)


def test_cfn_lint_passes_with_the_probe(synth: Synth) -> None:
    _cfn_lint(synth[2])


class _Stack:
    """CloudFormation and Lambda as a deployment of the synthesized template would answer (physical ids made up)."""

    def __init__(self, raw: dict[str, Any]) -> None:
        self.raw = raw

    def physical(self, logical: str) -> str:
        resource = self.raw["Resources"][logical]
        props = resource.get("Properties", {})
        if resource["Type"] == "AWS::SQS::Queue":
            name = props.get("QueueName") or f"DelayedDelivery-{logical}"
            return f"https://sqs.us-east-1.amazonaws.com/111122223333/{name}"
        return str(
            props.get("FunctionName") or props.get("TableName") or props.get("BucketName") or f"phys-{logical}".lower()
        )

    def value(self, item: Any) -> str:
        """A template value resolved (a queue's Ref is its URL, its QueueName attribute the name)."""
        if isinstance(item, dict) and "Ref" in item:
            return self.physical(item["Ref"])
        if isinstance(item, dict) and "Fn::GetAtt" in item:
            logical, attribute = item["Fn::GetAtt"]
            found = self.physical(logical)
            return found.rsplit("/", 1)[-1] if attribute == "QueueName" else f"arn:aws:::{found}"
        return str(item)

    def describe_stacks(self, StackName: str) -> dict[str, Any]:
        outputs = [{"OutputKey": k, "OutputValue": self.value(v["Value"])} for k, v in self.raw["Outputs"].items()]
        return {"Stacks": [{"Outputs": outputs}]}

    def list_stack_resources(self, StackName: str, **_: Any) -> dict[str, Any]:
        return {
            "StackResourceSummaries": [
                {"ResourceType": v["Type"], "PhysicalResourceId": self.physical(k)}
                for k, v in self.raw["Resources"].items()
            ]
        }

    def get_function_configuration(self, FunctionName: str) -> dict[str, Any]:
        [props] = [
            v["Properties"]
            for k, v in self.raw["Resources"].items()
            if v["Type"] == "AWS::Lambda::Function" and self.physical(k) == FunctionName
        ]
        env = {k: self.value(v) for k, v in props["Environment"]["Variables"].items()}
        return {
            "FunctionName": FunctionName,
            "Handler": props["Handler"],
            "Timeout": props["Timeout"],
            "MemorySize": props["MemorySize"],
            "Role": f"arn:aws:iam::111122223333:role/{FunctionName}",
            "Environment": {"Variables": env},
        }

    def get_function_concurrency(self, FunctionName: str) -> dict[str, Any]:
        config = self.get_function_configuration(FunctionName)
        [props] = [
            v["Properties"]
            for k, v in self.raw["Resources"].items()
            if v["Type"] == "AWS::Lambda::Function" and self.physical(k) == config["FunctionName"]
        ]
        found = props.get("ReservedConcurrentExecutions")
        return {} if found is None else {"ReservedConcurrentExecutions": found}


def test_verify_finds_everything_in_the_synthesized_stack(synth: Synth) -> None:
    from delayed_delivery.aws.verify import discover_stack

    fake = _Stack(synth[1])
    target = discover_stack(fake, fake, "DelayedDelivery", "us-east-1")
    assert [e.name for e in target.endpoints] == ["orders"] and target.probe is not None
    assert target.probe.name == PROBE and target.probe.function.timeout == 30
    assert target.probe.error_queue.startswith("DelayedDelivery-VerifyProbe"), target.probe.error_queue
    assert target.endpoints[0].error_queue.startswith("DelayedDelivery-Endpointorders"), target.endpoints[0]
    assert target.tier is not None and target.tier.timer.reserved_concurrency == 1
    assert target.tier.config.sqs_settings.bucket_ingest_queue == "delayed-delivery-ingest"
    assert target.tier.schedule_rule and target.cancellation_table == "delayed-delivery-cancellations"
    assert target.sqs_settings.fifo_queue_delay == 900 and len(target.alarms) >= 8
