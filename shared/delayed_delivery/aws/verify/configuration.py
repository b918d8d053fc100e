"""Configuration checks of ``aws verify``: each reads what is deployed and returns one ``CheckResult``.

Per endpoint: the input queue, ``-delay.fifo`` against the FIFO queue rules, its visibility against the function
timeout, encryption, the error queue and the event source mapping; the stack: the cancellation table and the alarms.
The tier's checks are in ``tier_checks.py``.
"""

from __future__ import annotations

import json
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from ...verification import CheckResult, Group, failed, needs_account, passed, skipped, warned
from ..queues import MIN_RETENTION_SECONDS, PARK_RETENTION_SECONDS
from ..retention import Holding, retention_fix, retention_problem
from ..sqs import translate_error
from .context import AwsVerifyContext, QueueFacts
from .target import EndpointTarget, FunctionTarget

__all__ = [
    "VISIBILITY_FACTOR",
    "alarms",
    "cancellation_table",
    "delay_queue",
    "delay_redrive",
    "delay_retention",
    "delay_visibility",
    "encryption",
    "error_queue",
    "event_source",
    "input_queue",
]

C = Group.CONFIGURATION
#: Lambda's advice: a queue's visibility at least six times the function timeout, so retries are not cut short.
VISIBILITY_FACTOR = 6
#: The mapping states that count as "on" and as "off" (a mapping being switched is on its way there).
_STATES = {"Enabled": ("Enabled", "Enabling", "Updating"), "Disabled": ("Disabled", "Disabling")}
_LOCAL_FUNCTION = "the function runs in this command on an emulator, which has no event source mapping"


def missing_queue_result(check: str, subject: str, what: str, fix: str) -> CheckResult:
    """A failed check for a queue that does not exist."""
    return failed(check, C, subject, f"{what} does not exist", fix)


def input_queue(ctx: AwsVerifyContext, ep: EndpointTarget) -> CheckResult:
    """The endpoint's input queue exists."""
    facts = ctx.queue(ep.name)
    if facts is None:
        return missing_queue_result("input-queue", ep.name, f"input queue {ep.name!r}", "deploy infra/aws (cdk deploy)")
    return passed("input-queue", C, ep.name, f"input queue {ep.name!r} exists")


def delay_queue(ctx: AwsVerifyContext, ep: EndpointTarget) -> CheckResult:
    """``-delay.fifo`` exists, is FIFO and holds each hop for exactly ``fifo_queue_delay``."""
    facts, hop = ctx.queue(ep.delay_queue), ctx.target.sqs_settings.fifo_queue_delay
    if facts is None:
        again = f"`delayed-delivery aws create --queue {ep.name}`" if ctx.target.local else "cdk deploy"
        return missing_queue_result(
            "delay-queue",
            ep.delay_queue,
            f"delay queue {ep.delay_queue!r}",
            f"recreate it as a FIFO queue with DelaySeconds={hop}: {again}",
        )
    if facts.attributes.get("FifoQueue", "false").lower() != "true":
        return failed("delay-queue", C, ep.delay_queue, "it is not a FIFO queue", "recreate it as a FIFO queue")
    delay = facts.number("DelaySeconds")
    if delay != hop:
        return failed(
            "delay-queue",
            C,
            ep.delay_queue,
            f"DelaySeconds {delay} s, but every hop must wait {hop} s (the requeue function's fifo_queue_delay)",
            f"set DelaySeconds to {hop}",
        )
    return passed("delay-queue", C, ep.delay_queue, f"FIFO, DelaySeconds {delay} s")


def delay_retention(ctx: AwsVerifyContext, ep: EndpointTarget) -> CheckResult:
    """Retention of ``-delay.fifo``: at least 4 days (the FIFO queue rules), 14 days so parks re-send rarely."""
    facts = ctx.queue(ep.delay_queue)
    if facts is None:
        return skipped("delay-queue-retention", C, ep.delay_queue, "the delay queue does not exist")
    retention = facts.number("MessageRetentionPeriod")
    evidence = f"MessageRetentionPeriod {retention:,} s"
    if retention < MIN_RETENTION_SECONDS:
        return failed(
            "delay-queue-retention",
            C,
            ep.delay_queue,
            f"{evidence} < 4 days: a hop held up by an outage may expire",
            f"raise MessageRetentionPeriod to {PARK_RETENTION_SECONDS}",
        )
    if retention < PARK_RETENTION_SECONDS:
        return warned(
            "delay-queue-retention",
            C,
            ep.delay_queue,
            f"{evidence} < 14 days: parked messages are re-sent more often than needed",
            f"raise MessageRetentionPeriod to {PARK_RETENTION_SECONDS}",
        )
    return passed("delay-queue-retention", C, ep.delay_queue, evidence)


def delay_redrive(ctx: AwsVerifyContext, ep: EndpointTarget) -> CheckResult:
    """No redrive policy on ``-delay.fifo``: a receive-count DLQ would move long delays away."""
    facts = ctx.queue(ep.delay_queue)
    if facts is None:
        return skipped("delay-queue-redrive", C, ep.delay_queue, "the delay queue does not exist")
    if facts.attributes.get("RedrivePolicy"):
        target = json.loads(facts.attributes["RedrivePolicy"]).get("deadLetterTargetArn", "?")
        return failed(
            "delay-queue-redrive",
            C,
            ep.delay_queue,
            f"a redrive policy moves messages to {target} by receive count, and parked messages are received often",
            "remove the RedrivePolicy (the requeue function moves poison records to the error queue itself)",
        )
    return passed("delay-queue-redrive", C, ep.delay_queue, "no redrive policy")


def visibility_result(
    check: str, subject: str, facts: QueueFacts, function: FunctionTarget, extra: float
) -> CheckResult:
    """A check that a queue's visibility covers its function's timeout (times the factor, plus ``extra``)."""
    visibility = facts.number("VisibilityTimeout")
    needed = int(VISIBILITY_FACTOR * function.timeout + extra)
    window = f" + batching window {extra:g} s" if extra else ""
    said = f"visibility {visibility} s < {VISIBILITY_FACTOR} × function timeout {function.timeout:g} s{window}"
    if visibility < function.timeout + extra:
        return failed(
            check,
            C,
            subject,
            f"{said}: Lambda refuses the event source, and a slow batch is handled twice",
            f"raise VisibilityTimeout to {needed}",
        )
    if visibility < needed:
        return failed(
            check,
            C,
            subject,
            f"{said}: a retried batch reappears while it still runs",
            f"raise VisibilityTimeout to {needed}",
        )
    return passed(
        check, C, subject, f"visibility {visibility} s ≥ {VISIBILITY_FACTOR} × function timeout {function.timeout:g} s"
    )


def delay_visibility(ctx: AwsVerifyContext, ep: EndpointTarget) -> CheckResult:
    """``-delay.fifo``'s visibility is at least six times the requeue function's timeout."""
    facts = ctx.queue(ep.delay_queue)
    if facts is None:
        return skipped("delay-queue-visibility", C, ep.delay_queue, "the delay queue does not exist")
    return visibility_result("delay-queue-visibility", ep.delay_queue, facts, ep.function, 0.0)


def _encrypted(facts: QueueFacts) -> bool:
    return facts.attributes.get("SqsManagedSseEnabled", "false").lower() == "true" or bool(
        facts.attributes.get("KmsMasterKeyId")
    )


def encryption(ctx: AwsVerifyContext, ep: EndpointTarget) -> CheckResult:
    """Every queue of the endpoint is encrypted at rest (SQS-managed or a KMS key)."""
    names = [ep.name, ep.delay_queue, *([ep.error_queue] if ep.error_queue else [])]
    found = {n: ctx.queue(n) for n in names}
    plain = [n for n, f in found.items() if f is not None and not _encrypted(f)]
    if plain:
        return failed(
            "queue-encryption",
            C,
            ep.name,
            f"not encrypted at rest: {', '.join(plain)}",
            "set SqsManagedSseEnabled=true (or a KmsMasterKeyId) on each",
        )
    return passed("queue-encryption", C, ep.name, f"encrypted: {', '.join(n for n, f in found.items() if f)}")


def held_result(check: str, facts: QueueFacts, kind: Holding, evidence: str) -> CheckResult:
    """``evidence`` passes unless the queue's retention loses messages (then: the problem and the command)."""
    said = retention_problem(kind, facts.name, facts.number("MessageRetentionPeriod"))
    if said:
        return failed(check, C, facts.name, said, retention_fix(facts.url))
    return passed(check, C, facts.name, f"{evidence}, keeps messages 14 days")


def error_queue(ctx: AwsVerifyContext, ep: EndpointTarget) -> CheckResult:
    """The endpoint's error queue exists and keeps its messages 14 days."""
    if not ep.error_queue:
        return failed(
            "error-queue",
            C,
            ep.name,
            "the requeue function names no error queue (DELAYED_DELIVERY_ERROR_QUEUE is not set)",
            "deploy infra/aws again: the construct sets it",
        )
    facts = ctx.queue(ep.error_queue)
    if facts is None:
        return missing_queue_result(
            "error-queue", ep.error_queue, f"error queue {ep.error_queue!r}", "create it (cdk deploy creates it)"
        )
    return held_result("error-queue", facts, Holding.ERROR, f"error queue {ep.error_queue!r} exists")


def _mapping(ctx: AwsVerifyContext, function: str, queue_name: str) -> dict[str, Any] | None:
    """The event source mapping of ``function`` on ``queue_name``, if any."""
    try:
        pages = ctx.clients.lambda_.get_paginator("list_event_source_mappings").paginate(FunctionName=function)
        mappings = [m for page in pages for m in page.get("EventSourceMappings", [])]
    except (ClientError, BotoCoreError) as exc:
        raise translate_error(exc, f"reading the event source mappings of {function!r}") from exc
    for mapping in mappings:
        if str(mapping.get("EventSourceArn", "")).rsplit(":", 1)[-1] == queue_name:
            found: dict[str, Any] = mapping
            return found
    return None


def event_source_result(
    ctx: AwsVerifyContext, check: str, function: FunctionTarget, queue_name: str, *, batch: int, at_rest: str
) -> CheckResult:
    """The mapping exists, has partial batch responses, a batch size up to ``batch`` and the state ``at_rest``."""
    if function.name is None:
        return needs_account(
            check,
            C,
            queue_name,
            f"will check the function's SQS event source on {queue_name}: {at_rest.lower()}, batch size ≤ {batch}, "
            f"ReportBatchItemFailures, maximum concurrency ≥ 2 ({_LOCAL_FUNCTION})",
        )
    if not function.name:
        return failed(check, C, queue_name, "no function of the stack serves this queue", "deploy infra/aws again")
    mapping = _mapping(ctx, function.name, queue_name)
    if mapping is None:
        return failed(
            check,
            C,
            queue_name,
            f"{function.name} has no event source mapping on {queue_name}: nothing moves its messages",
            f"add the SQS event source (cdk deploy restores it): aws lambda create-event-source-mapping "
            f"--function-name {function.name} --event-source-arn <arn of {queue_name}> --batch-size {batch} "
            "--function-response-types ReportBatchItemFailures",
        )
    state, size = str(mapping.get("State", "?")), int(mapping.get("BatchSize", 0))
    partial = "ReportBatchItemFailures" in (mapping.get("FunctionResponseTypes") or [])
    concurrency = (mapping.get("ScalingConfig") or {}).get("MaximumConcurrency")
    evidence = f"{state}, batch size {size}, partial batch responses {'on' if partial else 'off'}"
    evidence += f", maximum concurrency {concurrency}" if concurrency else ""
    uuid = mapping.get("UUID", "<uuid>")
    if not partial:
        return failed(
            check,
            C,
            queue_name,
            f"{evidence}: one bad record fails the whole batch again",
            f"aws lambda update-event-source-mapping --uuid {uuid} --function-response-types ReportBatchItemFailures",
        )
    if size > batch:
        return failed(
            check,
            C,
            queue_name,
            f"{evidence}: more than {batch}",
            f"aws lambda update-event-source-mapping --uuid {uuid} --batch-size {batch}",
        )
    if state not in _STATES[at_rest]:
        return failed(
            check,
            C,
            queue_name,
            f"{evidence}, expected {at_rest}",
            f"aws lambda update-event-source-mapping --uuid {uuid} --"
            f"{'enabled' if at_rest == 'Enabled' else 'no-enabled'}",
        )
    return passed(check, C, queue_name, evidence)


def event_source(ctx: AwsVerifyContext, ep: EndpointTarget, *, probe: bool = False) -> CheckResult:
    """The requeue function's event source on ``-delay.fifo`` (the probe's is off at rest: zero idle cost)."""
    return event_source_result(
        ctx, "event-source", ep.function, ep.delay_queue, batch=10, at_rest="Disabled" if probe else "Enabled"
    )


def cancellation_table(ctx: AwsVerifyContext) -> CheckResult:
    """The cancellation table exists and expires its records (TTL on ``expires_at``)."""
    table = ctx.target.cancellation_table
    if not table:
        return skipped("cancellation-table", C, "-", "no cancellation table is configured")
    client = ctx.clients.dynamodb
    try:
        client.describe_table(TableName=table)
        ttl = client.describe_time_to_live(TableName=table).get("TimeToLiveDescription", {})
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "ResourceNotFoundException":
            return failed(
                "cancellation-table",
                C,
                table,
                f"table {table!r} does not exist: cancel and reschedule records cannot be written",
                "deploy infra/aws (or `delayed-delivery aws create`)",
            )
        raise translate_error(exc, f"reading the table {table!r}") from exc
    except BotoCoreError as exc:
        raise translate_error(exc, f"reading the table {table!r}") from exc
    status, attribute = ttl.get("TimeToLiveStatus", "DISABLED"), ttl.get("AttributeName")
    if status not in ("ENABLED", "ENABLING") or attribute != "expires_at":
        return warned(
            "cancellation-table",
            C,
            table,
            f"TTL {status} on {attribute!r}: old records stay for good",
            f"aws dynamodb update-time-to-live --table-name {table} "
            "--time-to-live-specification Enabled=true,AttributeName=expires_at",
        )
    return passed("cancellation-table", C, table, "exists; records expire (TTL on expires_at)")


def alarms(ctx: AwsVerifyContext) -> CheckResult:
    """The stack's alarms exist with their actions enabled; those in ALARM are named."""
    if ctx.target.local:
        return needs_account(
            "alarms",
            C,
            "alarms",
            "will check every alarm of the stack exists with actions enabled (error queue not empty, function "
            "errors, requeue falling behind; the tier's overdue bucket, ingest age, DLQ, timer failing) and name "
            "those in ALARM",
        )
    names = list(ctx.target.alarms)
    if not names:
        return failed("alarms", C, "alarms", "the stack has no alarms", "deploy infra/aws again (it adds them)")
    found: dict[str, dict[str, Any]] = {}
    try:
        for i in range(0, len(names), 100):
            for alarm in ctx.clients.cloudwatch.describe_alarms(AlarmNames=names[i : i + 100]).get("MetricAlarms", []):
                found[alarm["AlarmName"]] = alarm
    except (ClientError, BotoCoreError) as exc:
        raise translate_error(exc, "reading the alarms") from exc
    missing = [n for n in names if n not in found]
    silent = [n for n, a in found.items() if not a.get("ActionsEnabled", True)]
    firing = [n for n, a in found.items() if a.get("StateValue") == "ALARM"]
    evidence = f"{len(found)} alarm(s), {len(firing)} in ALARM" + (f" ({', '.join(firing[:5])})" if firing else "")
    if missing:
        return failed("alarms", C, "alarms", f"{evidence}; missing: {', '.join(missing[:5])}", "cdk deploy")
    if silent:
        return failed(
            "alarms",
            C,
            "alarms",
            f"{evidence}; actions disabled on {', '.join(silent[:5])}",
            f"aws cloudwatch enable-alarm-actions --alarm-names {' '.join(silent[:5])}",
        )
    if firing:
        return warned("alarms", C, "alarms", evidence, "look at the dashboard and the alarms' reasons")
    return passed("alarms", C, "alarms", evidence)
