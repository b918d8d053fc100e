"""IAM policy simulation: each function's role may do what it needs, and not what it must not.

``iam:SimulatePrincipalPolicy`` evaluates the role's own policies (identity-based) for a list of actions on named
resources, with the context keys the policies test (``dynamodb:LeadingKeys``, ``s3:prefix``). Needed requests must
be allowed; a sample of requests outside the function's job (another queue, another partition, objects outside the
prefix, deleting its own queue) must be denied. Emulators do not simulate policies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from ...verification import CheckResult, Group, failed, needs_account, passed
from ..sqs import translate_error
from .context import AwsVerifyContext
from .target import EndpointTarget, FunctionTarget

__all__ = ["Request", "endpoint_role", "ingest_role", "timer_role"]

P = Group.PERMISSIONS


@dataclass(frozen=True, slots=True)
class Request:
    """One request to simulate: an action on a resource, with context keys."""

    action: str
    resource: str
    context: dict[str, list[str]] = field(default_factory=dict)

    def describe(self) -> str:
        """``sqs:SendMessage on arn:…``."""
        keys = "".join(f" ({k}={','.join(v)})" for k, v in self.context.items())
        return f"{self.action} on {self.resource}{keys}"


def _arn(ctx: AwsVerifyContext, queue: str) -> str:
    facts = ctx.queue(queue)
    return facts.attributes.get("QueueArn", "") if facts else ""


def _foreign(arn: str, name: str) -> str:
    """An ARN beside ``arn`` (same service, region, account) with another last part."""
    return arn.rsplit(":", 1)[0] + ":" + name if arn else ""


def _simulate(ctx: AwsVerifyContext, role: str, request: Request) -> str:
    """The decision: ``allowed``, ``implicitDeny`` or ``explicitDeny``."""
    entries = [
        {"ContextKeyName": k, "ContextKeyValues": v, "ContextKeyType": "stringList"} for k, v in request.context.items()
    ]
    try:
        reply = ctx.clients.iam.simulate_principal_policy(
            PolicySourceArn=role, ActionNames=[request.action], ResourceArns=[request.resource], ContextEntries=entries
        )
    except (ClientError, BotoCoreError) as exc:
        raise translate_error(exc, f"simulating {request.describe()} for {role}") from exc
    results: list[dict[str, Any]] = reply.get("EvaluationResults", [])
    return str(results[0].get("EvalDecision", "?")) if results else "?"


def _judge(
    ctx: AwsVerifyContext,
    check: str,
    function: FunctionTarget,
    needed: Sequence[Request],
    refused: Sequence[Request],
    serves: str,
) -> CheckResult:
    subject = function.name or serves
    if function.name is None:
        actions = sorted({r.action for r in needed})
        return needs_account(
            check,
            P,
            subject,
            f"will simulate the role of the function serving {serves} (iam:SimulatePrincipalPolicy): "
            f"{len(needed)} requests it needs ({', '.join(actions)}) allowed, {len(refused)} outside its job "
            "(another queue or partition, outside the prefix, deleting its queue) denied",
        )
    role = function.role_arn or ""
    if not role:
        return failed(check, P, subject, "the function has no role", "deploy infra/aws again")
    missing = [r for r in needed if r.resource and _simulate(ctx, role, r) != "allowed"]
    extra = [r for r in refused if r.resource and _simulate(ctx, role, r) == "allowed"]
    if missing or extra:
        said = [f"not allowed: {r.describe()}" for r in missing] + [
            f"allowed but should not be: {r.describe()}" for r in extra
        ]
        fix = "deploy infra/aws again: the construct grants exactly what is needed" + (
            "; remove the broader statements or managed policies attached to the role" if extra else ""
        )
        return failed(check, P, subject, f"role {role}: " + "; ".join(said), fix)
    return passed(
        check, P, subject, f"role {role}: {len(needed)} needed requests allowed, {len(refused)} others denied"
    )


def endpoint_role(ctx: AwsVerifyContext, ep: EndpointTarget) -> CheckResult:
    """The requeue function: its FIFO queue, its input and error queues, its own partition of the table."""
    delay, target, errors = _arn(ctx, ep.delay_queue), _arn(ctx, ep.name), _arn(ctx, ep.error_queue)
    needed = [
        *(Request(a, delay) for a in ("sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility")),
        *(Request("sqs:SendMessage", arn) for arn in (delay, target, errors)),
    ]
    refused = [
        Request("sqs:SendMessage", _foreign(delay, "delayed-delivery-verify-not-yours")),
        Request("sqs:DeleteQueue", delay),
        Request("sqs:PurgeQueue", target),
    ]
    table = ctx.target.cancellation_table
    if table and delay:
        parts = delay.split(":")
        table_arn = f"arn:{parts[1]}:dynamodb:{parts[3]}:{parts[4]}:table/{table}"
        needed.append(Request("dynamodb:Query", table_arn, {"dynamodb:LeadingKeys": [ep.name]}))
        refused.append(Request("dynamodb:Query", table_arn, {"dynamodb:LeadingKeys": ["another-endpoint"]}))
    return _judge(ctx, "function-role", ep.function, needed, refused, ep.delay_queue)


def ingest_role(ctx: AwsVerifyContext) -> CheckResult:
    """The ingest function: write objects under the prefix, send to the tier's error queue; nothing else."""
    tier = ctx.target.tier
    assert tier is not None
    objects = f"arn:aws:s3:::{tier.config.bucket_name}/{tier.config.prefix}"
    needed = [
        Request("s3:PutObject", f"{objects}/verify-probe"),
        Request("sqs:SendMessage", _arn(ctx, tier.config.settings.error_queue)),
        Request("sqs:ReceiveMessage", _arn(ctx, tier.config.sqs_settings.bucket_ingest_queue)),
    ]
    refused = [
        Request("s3:PutObject", f"arn:aws:s3:::{tier.config.bucket_name}/outside-the-prefix"),
        Request("s3:DeleteObject", f"{objects}/verify-probe"),
    ]
    return _judge(ctx, "tier-ingest-role", tier.ingest, needed, refused, tier.config.sqs_settings.bucket_ingest_queue)


def timer_role(ctx: AwsVerifyContext) -> CheckResult:
    """The timer: list, read, write and delete under the prefix, send to the destinations and the error queue."""
    tier = ctx.target.tier
    assert tier is not None
    bucket = f"arn:aws:s3:::{tier.config.bucket_name}"
    objects = f"{bucket}/{tier.config.prefix}/verify-probe"
    destinations = [_arn(ctx, e.name) for e in ctx.target.all_endpoints]
    needed = [
        Request("s3:ListBucket", bucket, {"s3:prefix": [f"{tier.config.prefix}/verify"]}),
        *(Request(a, objects) for a in ("s3:GetObject", "s3:PutObject", "s3:DeleteObject")),
        *(Request("sqs:SendMessage", arn) for arn in (*destinations, _arn(ctx, tier.config.settings.error_queue))),
    ]
    refused = [
        Request("s3:GetObject", f"{bucket}/outside-the-prefix"),
        Request("s3:DeleteBucket", bucket),
        Request("sqs:SendMessage", _foreign(destinations[0] if destinations else "", "delayed-delivery-not-yours")),
    ]
    return _judge(ctx, "tier-timer-role", tier.timer, needed, refused, f"s3://{tier.config.bucket_name}")
