"""The checks only an account answers (event sources, the schedule, alarms, IAM simulation, CloudWatch counts, the
probe's event source switched on and off), each fed what the AWS API returns for a healthy and a broken deployment.

No emulator serves these APIs as AWS does (moto's Lambda needs Docker to run an event source, it does not simulate
IAM policies or count SQS metrics), so the clients here answer with AWS's documented response shapes."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from delayed_delivery.aws.tier.config import BucketTierConfig
from delayed_delivery.aws.verify import configuration as config
from delayed_delivery.aws.verify import permissions
from delayed_delivery.aws.verify import tier_checks as tier
from delayed_delivery.aws.verify.context import AwsClients, AwsVerifyContext, QueueFacts
from delayed_delivery.aws.verify.run import _switch_on_probe
from delayed_delivery.aws.verify.target import AwsTarget, EndpointTarget, FunctionTarget, TierTarget
from delayed_delivery.aws.verify.usage import CloudWatchUsage, cost_check
from delayed_delivery.clock import ManualClock
from delayed_delivery.settings import DelayedDeliverySettings
from delayed_delivery.verification import Cleanup, Status, VerifySettings

ARN = "arn:aws:sqs:eu-west-1:111122223333"
REQUEUE = FunctionTarget("DelayedDelivery-Requeue-1", 30.0, "arn:aws:iam::111122223333:role/DelayedDelivery-R")
PROBE_FN = FunctionTarget("DelayedDelivery-VerifyProbe-1", 30.0, "arn:aws:iam::111122223333:role/DelayedDelivery-P")
ORDERS = EndpointTarget("orders", "DelayedDelivery-Errors-1", REQUEUE)
PROBE = EndpointTarget("delayed-delivery-probe", "DelayedDelivery-VerifyProbeErrors-1", PROBE_FN)
TIMER = FunctionTarget("DelayedDelivery-Timer-1", 300.0, "arn:aws:iam::111122223333:role/DelayedDelivery-T", 1)


def _mapping(queue: str, **over: Any) -> dict[str, Any]:
    return {
        "UUID": f"uuid-{queue}",
        "EventSourceArn": f"{ARN}:{queue}",
        "State": "Enabled",
        "BatchSize": 10,
        "FunctionResponseTypes": ["ReportBatchItemFailures"],
        **over,
    }


@dataclass
class FakeLambda:
    """ListEventSourceMappings (one page) and UpdateEventSourceMapping."""

    mappings: dict[str, list[dict[str, Any]]]
    updates: list[tuple[str, bool]] = field(default_factory=list)

    def get_paginator(self, _name: str) -> Any:
        outer = self

        class Pages:
            def paginate(self, FunctionName: str) -> list[dict[str, Any]]:
                return [{"EventSourceMappings": outer.mappings.get(FunctionName, [])}]

        return Pages()

    def list_event_source_mappings(self, FunctionName: str) -> dict[str, Any]:
        return {"EventSourceMappings": self.mappings.get(FunctionName, [])}

    def update_event_source_mapping(self, UUID: str, Enabled: bool) -> dict[str, Any]:
        self.updates.append((UUID, Enabled))
        return {}


@dataclass
class FakeEvents:
    rule: dict[str, Any]
    targets: list[dict[str, Any]]

    def describe_rule(self, Name: str) -> dict[str, Any]:
        return self.rule

    def list_targets_by_rule(self, Rule: str) -> dict[str, Any]:
        return {"Targets": self.targets}


@dataclass
class FakeCloudWatch:
    alarms: list[dict[str, Any]] = field(default_factory=list)
    sums: dict[tuple[str, str], float] = field(default_factory=dict)
    queries: int = 0

    def describe_alarms(self, AlarmNames: list[str]) -> dict[str, Any]:
        return {"MetricAlarms": [a for a in self.alarms if a["AlarmName"] in AlarmNames]}

    def get_metric_data(self, MetricDataQueries: list[dict[str, Any]], StartTime: Any, EndTime: Any) -> dict[str, Any]:
        self.queries += 1
        metric = MetricDataQueries[0]["MetricStat"]["Metric"]
        value = self.sums.get((metric["MetricName"], metric["Dimensions"][0]["Value"]))
        return {"MetricDataResults": [{"Id": "m", "Values": [] if value is None else [value]}]}


@dataclass
class FakeIam:
    """SimulatePrincipalPolicy: ``allowed`` holds the (action, resource, context values) the role's policies allow."""

    allowed: set[tuple[str, str, tuple[str, ...]]]

    def simulate_principal_policy(self, **kw: Any) -> dict[str, Any]:
        context = tuple(v for entry in kw["ContextEntries"] for v in entry["ContextKeyValues"])
        key = (kw["ActionNames"][0], kw["ResourceArns"][0], context)
        decision = "allowed" if key in self.allowed else "implicitDeny"
        return {"EvaluationResults": [{"EvalActionName": key[0], "EvalDecision": decision}]}


def _context(clients: AwsClients, *, tier: TierTarget | None = None, alarms: tuple[str, ...] = ()) -> AwsVerifyContext:
    target = AwsTarget(
        "stack DelayedDelivery (eu-west-1)",
        False,
        DelayedDeliverySettings(),
        (ORDERS,),
        PROBE,
        tier,
        "delayed-delivery-cancellations",
        alarms,
        "DelayedDelivery",
    )
    ctx = AwsVerifyContext(
        target,
        clients,
        VerifySettings(),
        ManualClock(datetime(2030, 1, 1, tzinfo=UTC)),
        lambda _line: None,
        Cleanup(),
        None,
    )  # type: ignore[arg-type]
    for ep in target.all_endpoints:  # queue facts as GetQueueAttributes gives them
        for name in (ep.name, ep.delay_queue, ep.error_queue):
            ctx._queues[name] = QueueFacts(name, f"https://sqs/{name}", {"QueueArn": f"{ARN}:{name}"})
    return ctx


def test_event_sources_healthy_missing_without_partial_failures_and_the_probe_off_at_rest() -> None:
    lam = FakeLambda(
        {
            REQUEUE.name: [_mapping("orders-delay.fifo")],
            PROBE_FN.name: [_mapping("delayed-delivery-probe-delay.fifo", State="Disabled")],
        }
    )
    ctx = _context(AwsClients(sqs=None, lambda_=lam))
    assert config.event_source(ctx, ORDERS).status is Status.PASS
    assert config.event_source(ctx, PROBE, probe=True).status is Status.PASS  # off at rest: zero idle cost
    lam.mappings[REQUEUE.name] = [_mapping("orders-delay.fifo", FunctionResponseTypes=[])]
    found = config.event_source(ctx, ORDERS)
    assert found.status is Status.FAIL and "--function-response-types ReportBatchItemFailures" in found.fix
    lam.mappings[REQUEUE.name] = [_mapping("orders-delay.fifo", State="Disabled")]
    found = config.event_source(ctx, ORDERS)
    assert found.status is Status.FAIL and found.fix.endswith("--uuid uuid-orders-delay.fifo --enabled")
    lam.mappings[REQUEUE.name] = []
    found = config.event_source(ctx, ORDERS)
    assert found.status is Status.FAIL and "nothing moves its messages" in found.evidence
    assert "aws lambda create-event-source-mapping" in found.fix


def _tier() -> TierTarget:
    return TierTarget(
        BucketTierConfig("dd-bucket"),
        FunctionTarget("DelayedDelivery-Ingest-1", 60.0),
        TIMER,
        "DelayedDelivery-EveryMinute-1",
    )


def test_the_schedule_enabled_every_minute_targeting_the_timer_one_at_a_time() -> None:
    rule = {"State": "ENABLED", "ScheduleExpression": "rate(1 minute)"}
    target = [{"Arn": f"arn:aws:lambda:eu-west-1:111122223333:function:{TIMER.name}"}]
    events = FakeEvents(rule, target)
    ctx = _context(AwsClients(sqs=None, events=events), tier=_tier())
    assert tier.schedule(ctx).status is Status.PASS
    events.rule = {**rule, "State": "DISABLED"}
    found = tier.schedule(ctx)
    assert found.status is Status.FAIL and found.fix == "aws events enable-rule --name DelayedDelivery-EveryMinute-1"
    events.rule, events.targets = rule, [{"Arn": "arn:aws:lambda:eu-west-1:111122223333:function:other"}]
    assert "does not target" in tier.schedule(ctx).evidence


def test_alarms_missing_silenced_and_firing() -> None:
    names = ("A-ErrorQueueNotEmpty", "A-FunctionErrors")
    cloudwatch = FakeCloudWatch([{"AlarmName": n, "ActionsEnabled": True, "StateValue": "OK"} for n in names])
    ctx = _context(AwsClients(sqs=None, cloudwatch=cloudwatch), alarms=names)
    assert config.alarms(ctx).status is Status.PASS
    cloudwatch.alarms[1]["StateValue"] = "ALARM"
    found = config.alarms(ctx)
    assert found.status is Status.WARN and "A-FunctionErrors" in found.evidence
    cloudwatch.alarms[0]["ActionsEnabled"] = False
    assert "enable-alarm-actions --alarm-names A-ErrorQueueNotEmpty" in config.alarms(ctx).fix
    cloudwatch.alarms.pop()
    assert "missing: A-FunctionErrors" in config.alarms(ctx).evidence


def test_the_role_simulation_needs_everything_and_refuses_the_rest() -> None:
    delay, target, errors = (f"{ARN}:{n}" for n in ("orders-delay.fifo", "orders", ORDERS.error_queue))
    table = "arn:aws:dynamodb:eu-west-1:111122223333:table/delayed-delivery-cancellations"
    needed = {(a, delay, ()) for a in ("sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility")}
    needed |= {("sqs:SendMessage", arn, ()) for arn in (delay, target, errors)}
    needed.add(("dynamodb:Query", table, ("orders",)))  # its own partition (dynamodb:LeadingKeys) only
    iam = FakeIam(set(needed))
    ctx = _context(AwsClients(sqs=None, iam=iam))
    assert permissions.endpoint_role(ctx, ORDERS).status is Status.PASS
    iam.allowed.discard(("sqs:SendMessage", errors, ()))
    iam.allowed |= {("sqs:PurgeQueue", target, ()), ("dynamodb:Query", table, ("another-endpoint",))}
    found = permissions.endpoint_role(ctx, ORDERS)
    assert found.status is Status.FAIL
    assert f"not allowed: sqs:SendMessage on {errors}" in found.evidence
    assert f"allowed but should not be: sqs:PurgeQueue on {target}" in found.evidence
    assert "dynamodb:Query on " in found.evidence and "(dynamodb:LeadingKeys=another-endpoint)" in found.evidence


def test_the_probes_event_source_is_switched_on_for_the_run_and_off_again() -> None:
    lam = FakeLambda({PROBE_FN.name: [_mapping("delayed-delivery-probe-delay.fifo", State="Disabled")]})
    ctx = _context(AwsClients(sqs=None, lambda_=lam))
    assert _switch_on_probe(ctx) is None
    assert lam.updates == [("uuid-delayed-delivery-probe-delay.fifo", True)]
    ctx.cleanup.run()
    assert lam.updates[-1] == ("uuid-delayed-delivery-probe-delay.fifo", False) and not ctx.cleanup.problems


@pytest.mark.parametrize("counted", [True, False])
def test_the_cost_line_waits_for_cloudwatch_then_prices_the_window(counted: bool) -> None:
    cloudwatch = FakeCloudWatch()
    ctx = _context(AwsClients(sqs=None, cloudwatch=cloudwatch))
    ctx.usage_meter = meter = CloudWatchUsage(memory_mb=256)
    meter.begin(ctx.clock.now())
    if counted:
        cloudwatch.sums = {
            ("NumberOfMessagesSent", PROBE.name): 2.0,
            ("NumberOfMessagesReceived", PROBE.name): 2.0,
            ("NumberOfEmptyReceives", PROBE.delay_queue): 30.0,
            ("Invocations", PROBE_FN.name): 2.0,
            ("Duration", PROBE_FN.name): 400.0,
        }
    found = cost_check(ctx, [("native", 30.0), ("delay-fifo", 960.0)], wait=120.0)
    if not counted:  # waited the whole 2 minutes (on the manual clock), then skipped: not a failure
        assert found.status is Status.SKIPPED and ctx.clock.now() >= datetime(2030, 1, 1, 0, 2, tzinfo=UTC)
        return
    assert found.status is Status.PASS and found.data["sqs_requests"] == 34.0
    expected = 4 * 0.0000004 + 30 * 0.0000005 + 2 * 0.0000002 + 0.4 * 0.25 * 0.0000166667
    assert found.data["usd_total"] == pytest.approx(expected)
    assert found.data["usd_per_message"] == pytest.approx(expected / 2)
