"""Configuration checks of ``aws verify`` for the S3 time-bucket tier: its bucket (access block, encryption,
lifecycle, TLS-only policy), the ingest queue's DLQ, visibility and retention, its error queue, the timer's schedule
and the ingest event source."""

from __future__ import annotations

import json
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from ...verification import CheckResult, failed, needs_account, passed, skipped
from ..retention import Holding, retention_fix, retention_problem
from ..sqs import translate_error
from ..tier.provision import INGEST_MAX_RECEIVES
from ..tier.store import translate_s3_error
from .configuration import C, event_source_result, held_result, missing_queue_result, visibility_result
from .context import AwsVerifyContext, QueueFacts
from .target import INGEST_BATCHING_WINDOW

__all__ = [
    "bucket",
    "bucket_policy",
    "ingest_dlq",
    "ingest_event_source",
    "ingest_retention",
    "ingest_visibility",
    "schedule",
    "tier_error_queue",
]


def ingest_event_source(ctx: AwsVerifyContext) -> CheckResult:
    """The ingest function's event source on the ingest queue."""
    tier = ctx.target.tier
    assert tier is not None
    queue = tier.config.sqs_settings.bucket_ingest_queue
    return event_source_result(ctx, "tier-ingest-event-source", tier.ingest, queue, batch=10_000, at_rest="Enabled")


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
    return visibility_result(
        "tier-ingest-visibility", facts.name, facts, ctx.target.tier.ingest, INGEST_BATCHING_WINDOW
    )


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
        return missing_queue_result(
            "tier-error-queue", name, f"the tier's error queue {name!r}", "create it (cdk deploy)"
        )
    return held_result("tier-error-queue", facts, Holding.ERROR, f"error queue {name!r} exists")


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
