"""One run of ``azure verify``: configuration, the timer's heartbeat, roles, alerts, the storage semantics and the
probes, then clean-up (on success, failure and Ctrl-C), as a report."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...errors import DelayedDeliveryError
from ...verification import CheckResult, Group, VerifyReport, failed
from . import configuration as config
from .context import AzureVerifyContext
from .probes import run_probes
from .roles import role_checks
from .semantics import lease_semantics, visibility_semantics

__all__ = ["verify_azure"]


def _safe(check: Callable[..., Any], ctx: AzureVerifyContext, group: Group = Group.CONFIGURATION) -> list[CheckResult]:
    """The check's result(s); one that cannot read what it needs fails with the reason instead of ending the run."""
    try:
        found = check(ctx)
    except DelayedDeliveryError as exc:
        return [
            failed(
                check.__name__.replace("_", "-"),
                group,
                "-",
                f"the check could not run: {' '.join(str(exc).split())}",
                "give the identity running verify the data roles in infra/azure/verify-role.json",
            )
        ]
    return list(found) if isinstance(found, list) else [found]


def verify_azure(ctx: AzureVerifyContext) -> VerifyReport:
    """Run every check of ``ctx.mode``; the clean-up runs however the run ends (Ctrl-C included)."""
    started = ctx.clock.now()
    results: list[CheckResult] = []
    interrupted = False
    with ctx.cleanup.scope():
        try:
            ctx.progress(f"checking the configuration of {ctx.target.description}")
            for check in (config.table, config.lease_container, config.queues, config.heartbeat):
                results += _safe(check, ctx)
            results += _safe(role_checks, ctx, Group.PERMISSIONS)
            results += _safe(config.alert_rules, ctx)
            results += _safe(lease_semantics, ctx, Group.BEHAVIOUR)
            results += _safe(visibility_semantics, ctx, Group.BEHAVIOUR)
            results += _safe(run_probes, ctx, Group.BEHAVIOUR)
        except KeyboardInterrupt:
            interrupted = True
            ctx.progress("interrupted: cleaning up")
    return VerifyReport(
        cloud="azure",
        target=ctx.target.description,
        mode=ctx.mode,
        local=ctx.target.local,
        started_at=started,
        finished_at=ctx.clock.now(),
        results=tuple(results),
        cleanup_problems=tuple(ctx.cleanup.problems),
        interrupted=interrupted,
    )
