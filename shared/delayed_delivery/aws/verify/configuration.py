"""Configuration checks of ``aws verify``: each reads what is deployed and returns one ``CheckResult``.

Per endpoint: the input queue, ``-delay.fifo`` against the FIFO queue rules, its visibility against the function
timeout, encryption, the error queue and the event source mapping. The tier: its bucket (access block, encryption,
lifecycle, TLS-only policy), the ingest queue's DLQ and visibility, its error queue, the timer's schedule and
the ingest event source. The stack: the cancellation table and the alarms.
"""

from __future__ import annotations

import json
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from ...verification import CheckResult, Group, failed, needs_account, passed, skipped, warned
from ..queues import MIN_RETENTION_SECONDS, PARK_RETENTION_SECONDS
from ..retention import Holding, retention_fix, retention_problem
from ..sqs import translate_error
from ..tier.provision import INGEST_MAX_RECEIVES
from ..tier.store import translate_s3_error
from .context import AwsVerifyContext, QueueFacts
from .target import INGEST_BATCHING_WINDOW, EndpointTarget, FunctionTarget

__all__ = [
    "VISIBILITY_FACTOR",
    "alarms",
    "bucket",
    "bucket_policy",
    "cancellation_table",
    "delay_queue",
    "delay_redrive",
    "delay_retention",
    "delay_visibility",
    "encryption",
    "error_queue",
    "event_source",
    "ingest_dlq",
    "ingest_event_source",
    "ingest_retention",
    "ingest_visibility",
    "input_queue",
    "schedule",
    "tier_error_queue",
]

C = Group.CONFIGURATION
#: Lambda's advice: a queue's visibility at least six times the function timeout, so retries are not cut short.
VISIBILITY_FACTOR = 6
#: The mapping states that count as "on" and as "off" (a mapping being switched is on its way there).
_STATES = {"Enabled": ("Enabled", "Enabling", "Updating"), "Disabled": ("Disabled", "Disabling")}
_LOCAL_FUNCTION = "the function runs in this command on an emulator, which has no event source mapping"


def _missing_queue(check: str, subject: str, what: str, fix: str) -> CheckResult:
    return failed(check, C, subject, f"{what} does not exist", fix)


def input_queue(ctx: AwsVerifyContext, ep: EndpointTarget) -> CheckResult:
    """The endpoint's input queue exists."""
    facts = ctx.queue(ep.name)
    if facts is None:
        return _missing_queue("input-queue", ep.name, f"input queue {ep.name!r}", "deploy infra/aws (cdk deploy)")
    return passed("input-queue", C, ep.name, f"input queue {ep.name!r} exists")


def delay_queue(ctx: AwsVerifyContext, ep: EndpointTarget) -> CheckResult:
    """``-delay.fifo`` exists, is FIFO and holds each hop for exactly ``fifo_queue_delay``."""
    facts, hop = ctx.queue(ep.delay_queue), ctx.target.sqs_settings.fifo_queue_delay
    if facts is None:
        again = f"`delayed-delivery aws create --queue {ep.name}`" if ctx.target.local else "cdk deploy"
        return _missing_queue(
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


def _visibility(check: str, subject: str, facts: QueueFacts, function: FunctionTarget, extra: float) -> CheckResult:
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
    return _visibility("delay-queue-visibility", ep.delay_queue, facts, ep.function, 0.0)


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


def _held(check: str, facts: QueueFacts, kind: Holding, evidence: str) -> CheckResult:
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
        return _missing_queue(
            "error-queue", ep.error_queue, f"error queue {ep.error_queue!r}", "create it (cdk deploy creates it)"
        )
    return _held("error-queue", facts, Holding.ERROR, f"error queue {ep.error_queue!r} exists")


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


def _event_source(
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
    return _event_source(
        ctx, "event-source", ep.function, ep.delay_queue, batch=10, at_rest="Disabled" if probe else "Enabled"
    )


def ingest_event_source(ctx: AwsVerifyContext) -> CheckResult:
    """The ingest function's event source on the ingest queue."""
    tier = ctx.target.tier
    assert tier is not None
    queue = tier.config.sqs_settings.bucket_ingest_queue
    return _event_source(ctx, "tier-ingest-event-source", tier.ingest, queue, batch=10_000, at_rest="Enabled")


def _s3_get(ctx: AwsVerifyContext, call: str, bucket_name: str, absent: set[str]) -> dict[str, Any] | None:
    try:
        reply: dict[str, Any] = getattr(ctx.clients.s3, call)(Bucket=bucket_name)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in absent:
            return None
        raise translate_s3_error(exc, f"reading bucket {bucket_name}", bucket_name) from exc
    except BotoCoreError as exc:
        raise translate_s3_error(exc, f"reading bucket {bucket_name}", bucket_name) from exc
    return reply


_ALL_BLOCKED = ("BlockPublicAcls", "IgnorePublicAcls", "BlockPublicPolicy", "RestrictPublicBuckets")


def bucket(ctx: AwsVerifyContext) -> CheckResult:
    """The tier's bucket exists, blocks public access, encrypts by default and expires lease objects."""
    tier = ctx.target.tier
    assert tier is not None
    name, leases = tier.config.bucket_name, f"{tier.config.prefix}/leases/"
    if _s3_get(ctx, "head_bucket", name, {"404", "NoSuchBucket", "NotFound"}) is None:
        return failed(
            "tier-bucket",
            C,
            name,
            f"bucket {name!r} does not exist",
            "deploy the tier (cdk deploy -c longDelayRoute=buckets) or `delayed-delivery aws create --buckets`",
        )
    block = (_s3_get(ctx, "get_public_access_block", name, {"NoSuchPublicAccessBlockConfiguration"}) or {}).get(
        "PublicAccessBlockConfiguration", {}
    )
    problems, fixes = [], []
    if any(block.get(k) is not True for k in _ALL_BLOCKED):
        problems.append("public access is not fully blocked")
        fixes.append("set all four BlockPublicAccess flags")
    if _s3_get(ctx, "get_bucket_encryption", name, {"ServerSideEncryptionConfigurationNotFoundError"}) is None:
        problems.append("no default encryption")
        fixes.append("set SSE-S3 (or SSE-KMS) default encryption")
    rules = (_s3_get(ctx, "get_bucket_lifecycle_configuration", name, {"NoSuchLifecycleConfiguration"}) or {}).get(
        "Rules", []
    )
    if not any(r.get("Expiration") and (r.get("Filter") or {}).get("Prefix", r.get("Prefix")) == leases for r in rules):
        problems.append(f"no lifecycle rule expiring {leases}")
        fixes.append(f"add a lifecycle rule expiring {leases} after 2 days")
    if problems:
        return failed("tier-bucket", C, name, "; ".join(problems), "; ".join(fixes))
    return passed("tier-bucket", C, name, "public access blocked, default encryption, lease objects expire")


def bucket_policy(ctx: AwsVerifyContext) -> CheckResult:
    """The bucket's policy refuses requests without TLS."""
    tier = ctx.target.tier
    assert tier is not None
    name = tier.config.bucket_name
    if not str(ctx.clients.s3.meta.endpoint_url).startswith("https://"):
        return needs_account(
            "tier-bucket-policy",
            C,
            name,
            "will check that the bucket policy denies every request without TLS (aws:SecureTransport false); this "
            "endpoint speaks plain HTTP, where such a policy would refuse every request",
        )
    if _s3_get(ctx, "head_bucket", name, {"404", "NoSuchBucket", "NotFound"}) is None:
        return skipped("tier-bucket-policy", C, name, "the bucket does not exist")
    policy = (_s3_get(ctx, "get_bucket_policy", name, {"NoSuchBucketPolicy"}) or {}).get("Policy")
    fix = (
        "add the statement Deny s3:* on the bucket and its objects when aws:SecureTransport is false "
        "(cdk deploy restores it)"
    )
    if not policy:
        return failed(
            "tier-bucket-policy", C, name, f"bucket {name!r} has no bucket policy: plain HTTP is allowed", fix
        )
    statements = json.loads(policy).get("Statement", [])
    statements = statements if isinstance(statements, list) else [statements]
    tls = any(
        s.get("Effect") == "Deny"
        and str((s.get("Condition") or {}).get("Bool", {}).get("aws:SecureTransport")) == "false"
        for s in statements
    )
    if not tls:
        return failed("tier-bucket-policy", C, name, "the bucket policy does not deny requests without TLS", fix)
    return passed("tier-bucket-policy", C, name, "the bucket policy denies requests without TLS")


def ingest_dlq(ctx: AwsVerifyContext) -> CheckResult:
    """The ingest queue redrives to its DLQ after a few receives, so a poison record cannot block it forever."""
    tier = ctx.target.tier
    assert tier is not None
    ingest, dlq = tier.config.sqs_settings.bucket_ingest_queue, tier.ingest_dlq
    facts = ctx.queue(ingest)
    if facts is None:
        return failed(
            "tier-ingest-dlq",
            C,
            ingest,
            f"ingest queue {ingest!r} does not exist",
            "deploy the tier (cdk deploy) or `delayed-delivery aws create --buckets`",
        )
    dlq_facts = ctx.queue(dlq)
    redrive = json.loads(facts.attributes.get("RedrivePolicy") or "{}")
    fix = (
        f"create {dlq!r} (14 days retention) and set the ingest queue's RedrivePolicy to "
        f'{{"deadLetterTargetArn": "<arn of {dlq}>", "maxReceiveCount": {INGEST_MAX_RECEIVES}}}'
    )
    if not redrive:
        return failed(
            "tier-ingest-dlq",
            C,
            ingest,
            "the ingest queue has no DLQ (no redrive policy): a record failing every retry is received forever",
            fix,
        )
    target = str(redrive.get("deadLetterTargetArn", ""))
    if dlq_facts is None or target != dlq_facts.attributes.get("QueueArn"):
        where = "does not exist" if dlq_facts is None else f"is not the redrive target ({target})"
        return failed("tier-ingest-dlq", C, ingest, f"the ingest DLQ {dlq!r} {where}", fix)
    receives = int(redrive.get("maxReceiveCount", 0))
    return passed("tier-ingest-dlq", C, ingest, f"redrives to {dlq} after {receives} receives")


def _ingest(ctx: AwsVerifyContext, check: str) -> QueueFacts | CheckResult:
    """The ingest queue's facts, or ``check`` skipped when there is no ingest queue."""
    tier = ctx.target.tier
    assert tier is not None
    name = tier.config.sqs_settings.bucket_ingest_queue
    return ctx.queue(name) or skipped(check, C, name, "no ingest queue")


def ingest_visibility(ctx: AwsVerifyContext) -> CheckResult:
    """The ingest queue's visibility is six times the ingest timeout plus its batching window."""
    facts = _ingest(ctx, "tier-ingest-visibility")
    if isinstance(facts, CheckResult):
        return facts
    assert ctx.target.tier is not None
    return _visibility("tier-ingest-visibility", facts.name, facts, ctx.target.tier.ingest, INGEST_BATCHING_WINDOW)


def ingest_retention(ctx: AwsVerifyContext) -> CheckResult:
    """The ingest queue and its DLQ keep records 14 days: shorter loses them (below the ingest's wait: all of them)."""
    ingest = _ingest(ctx, "tier-ingest-retention")
    if isinstance(ingest, CheckResult):
        return ingest
    assert ctx.target.tier is not None
    dlq = ctx.queue(ctx.target.tier.ingest_dlq)
    held = [(ingest, Holding.INGEST), *([(dlq, Holding.INGEST_DLQ)] if dlq is not None else [])]
    found = [(q, retention_problem(kind, q.name, q.number("MessageRetentionPeriod"))) for q, kind in held]
    problems = [(q, said) for q, said in found if said]
    if problems:
        evidence = "; ".join(said for _, said in problems)
        return failed(
            "tier-ingest-retention", C, ingest.name, evidence, "; ".join(retention_fix(q.url) for q, _ in problems)
        )
    kept = ", ".join(f"{q.name} {q.number('MessageRetentionPeriod'):,} s" for q, _ in found)
    return passed("tier-ingest-retention", C, ingest.name, f"MessageRetentionPeriod {kept}")


def tier_error_queue(ctx: AwsVerifyContext) -> CheckResult:
    """The tier's error queue exists and keeps its messages 14 days."""
    tier = ctx.target.tier
    assert tier is not None
    name = tier.config.settings.error_queue
    facts = ctx.queue(name)
    if facts is None:
        return _missing_queue("tier-error-queue", name, f"the tier's error queue {name!r}", "create it (cdk deploy)")
    return _held("tier-error-queue", facts, Holding.ERROR, f"error queue {name!r} exists")


def schedule(ctx: AwsVerifyContext) -> CheckResult:
    """The timer runs every minute, one at a time."""
    tier = ctx.target.tier
    assert tier is not None
    if tier.timer.name is None:
        return needs_account(
            "tier-schedule",
            C,
            "timer",
            "will check the EventBridge rule: enabled, rate(1 minute), targeting the timer function, and the "
            "timer's reserved concurrency of 1 (here the command runs the timer itself)",
        )
    rule, timer = tier.schedule_rule, tier.timer.name
    if not rule:
        return failed(
            "tier-schedule",
            C,
            "timer",
            "the stack has no schedule rule: the timer never runs",
            "deploy the tier again (cdk deploy): it adds the every-minute rule",
        )
    try:
        described = ctx.clients.events.describe_rule(Name=rule)
        targets = ctx.clients.events.list_targets_by_rule(Rule=rule).get("Targets", [])
    except (ClientError, BotoCoreError) as exc:
        raise translate_error(exc, f"reading the rule {rule!r}") from exc
    state, expression = described.get("State", "?"), described.get("ScheduleExpression", "?")
    evidence = f"rule {rule}: {state}, {expression}, reserved concurrency {tier.timer.reserved_concurrency}"
    if state != "ENABLED":
        return failed(
            "tier-schedule", C, "timer", f"{evidence}: the timer does not run", f"aws events enable-rule --name {rule}"
        )
    if not any(str(t.get("Arn", "")).endswith(f":function:{timer}") for t in targets):
        return failed(
            "tier-schedule",
            C,
            "timer",
            f"{evidence}, but it does not target {timer}",
            "deploy the tier again (cdk deploy)",
        )
    if tier.timer.reserved_concurrency != 1:
        return failed(
            "tier-schedule",
            C,
            "timer",
            f"{evidence}: two timer runs may overlap",
            f"aws lambda put-function-concurrency --function-name {timer} --reserved-concurrent-executions 1",
        )
    return passed("tier-schedule", C, "timer", evidence)


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
