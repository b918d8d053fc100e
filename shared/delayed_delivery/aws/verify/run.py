"""One run of ``aws verify``: configuration, permissions, the probes and their cost, then clean-up, as a report.

Everything the run creates (a temporary queue, the probe's records, the probe's event source switched on) is
registered with the run's ``Cleanup`` as it is made and undone when the run ends: on success, on a failure and on
Ctrl-C. User queues are only read; messages go only to the probe endpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from ...errors import DelayedDeliveryError
from ...verification import CheckResult, Group, Mode, VerifyReport, failed, run_verification
from ..sqs import translate_error
from . import configuration as config
from . import permissions
from . import tier_checks as tier
from .context import AwsVerifyContext
from .probes import run_probes
from .usage import cost_check
from .visibility import visibility_rule

__all__ = ["configuration_checks", "verify_aws"]

#: How long the cost check waits for CloudWatch in ``--quick`` at most (``--full`` waits ``metrics_wait``).
QUICK_METRICS_WAIT = 120.0


def _safe(check: Callable[..., CheckResult], ctx: AwsVerifyContext, *args: Any, **kw: Any) -> CheckResult:
    """The check's result; one that cannot read what it needs (access denied, throttled) fails with the reason."""
    try:
        return check(ctx, *args, **kw)
    except DelayedDeliveryError as exc:
        subject = getattr(args[0], "name", "-") if args else "-"
        return failed(
            check.__name__.replace("_", "-"),
            Group.CONFIGURATION,
            subject,
            f"the check could not run: {' '.join(str(exc).split())}",
            "give the role running verify the permissions in infra/aws/verify-policy.json",
        )


_ENDPOINT_CHECKS: tuple[Callable[..., CheckResult], ...] = (
    config.input_queue,
    config.delay_queue,
    config.delay_retention,
    config.delay_redrive,
    config.delay_visibility,
    config.encryption,
    config.error_queue,
)
_TIER_CHECKS: tuple[Callable[..., CheckResult], ...] = (
    tier.bucket,
    tier.bucket_policy,
    tier.ingest_dlq,
    tier.ingest_visibility,
    tier.ingest_retention,
    tier.tier_error_queue,
    tier.ingest_event_source,
    tier.schedule,
    permissions.ingest_role,
    permissions.timer_role,
)


def configuration_checks(ctx: AwsVerifyContext) -> list[CheckResult]:
    """Every configuration and permission check of the target, in report order."""
    results: list[CheckResult] = []
    for ep in ctx.target.all_endpoints:
        results += [_safe(check, ctx, ep) for check in _ENDPOINT_CHECKS]
        results.append(_safe(config.event_source, ctx, ep, probe=ep is ctx.target.probe))
        results.append(_safe(permissions.endpoint_role, ctx, ep))
    if ctx.target.tier is not None:
        results += [_safe(check, ctx) for check in _TIER_CHECKS]
    results += [_safe(config.cancellation_table, ctx), _safe(config.alarms, ctx)]
    return results


def _switch_on_probe(ctx: AwsVerifyContext) -> CheckResult | None:
    """In an account the probe's event source is off at rest (zero idle cost): on for the run, off again after."""
    probe = ctx.target.probe
    if ctx.target.local or probe is None or not probe.function.name:
        return None
    client = ctx.clients.lambda_
    try:
        mappings = client.list_event_source_mappings(FunctionName=probe.function.name).get("EventSourceMappings", [])
        found = [m for m in mappings if str(m.get("EventSourceArn", "")).endswith(":" + probe.delay_queue)]
        if not found:
            return None  # the configuration check reports it
        uuid = found[0]["UUID"]
        if str(found[0].get("State")) in ("Enabled", "Enabling"):
            return None
        client.update_event_source_mapping(UUID=uuid, Enabled=True)
    except (ClientError, BotoCoreError) as exc:
        error = translate_error(exc, "switching on the probe's event source")
        return failed(
            "probe-event-source",
            Group.BEHAVIOUR,
            probe.delay_queue,
            str(error),
            "give the role running verify lambda:UpdateEventSourceMapping (infra/aws/verify-policy.json)",
        )
    ctx.cleanup.add(
        "the probe's event source (switched off again)",
        lambda: client.update_event_source_mapping(UUID=uuid, Enabled=False),
    )
    ctx.progress(f"switched on the probe's event source on {probe.delay_queue} for this run")
    return None


def _probe_steps(ctx: AwsVerifyContext) -> list[Callable[[], list[CheckResult]]]:
    """The visibility rule, the probes and their cost (the cost step reads what the probe step sent)."""
    sent: list[tuple[str, float]] = []

    def probes() -> list[CheckResult]:
        switched = _switch_on_probe(ctx)
        if ctx.usage_meter is not None:
            ctx.usage_meter.begin(ctx.clock.now())
        try:
            results, kinds = run_probes(ctx)
        except DelayedDeliveryError as exc:
            return [
                failed(
                    "probes",
                    Group.BEHAVIOUR,
                    "probe endpoint",
                    f"the probes could not run: {exc}",
                    "give the role running verify the permissions in infra/aws/verify-policy.json",
                )
            ]
        sent.extend(kinds)
        return [*([switched] if switched else []), *results]

    def cost(c: AwsVerifyContext) -> CheckResult:
        wait = c.settings.metrics_wait if c.mode is Mode.FULL else min(QUICK_METRICS_WAIT, c.settings.metrics_wait)
        return cost_check(c, sent, wait)

    return [lambda: [_safe(visibility_rule, ctx)], probes, lambda: [_safe(cost, ctx)]]


def verify_aws(ctx: AwsVerifyContext) -> VerifyReport:
    """Run every check of ``ctx.mode``; the clean-up runs however the run ends (Ctrl-C included)."""

    def configuration() -> list[CheckResult]:
        ctx.progress(f"checking the configuration of {ctx.target.description}")
        return configuration_checks(ctx)

    return run_verification(
        cloud="aws",
        target=ctx.target.description,
        mode=ctx.mode,
        local=ctx.target.local,
        clock=ctx.clock,
        cleanup=ctx.cleanup,
        progress=ctx.progress,
        steps=[configuration, *_probe_steps(ctx)],
    )
