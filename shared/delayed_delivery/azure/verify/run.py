"""One run of ``azure verify``: configuration, the timer's heartbeat, roles, alerts, the storage semantics and the
probes, then clean-up (on success, failure and Ctrl-C), as a report."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from ...errors import DelayedDeliveryError
from ...verification import CheckResult, Group, VerifyReport, failed, run_verification
from . import configuration as config
from .context import AzureVerifyContext
from .probes import run_probes
from .roles import role_checks
from .schedules import schedule_checks
from .semantics import lease_semantics, visibility_semantics
from .shards import shard_count

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

    def configuration() -> list[CheckResult]:
        ctx.progress(f"checking the configuration of {ctx.target.description}")
        found: list[CheckResult] = []
        for check in (config.table, config.lease_container, config.queues, config.heartbeat):
            found += _safe(check, ctx)
        found += _safe(shard_count, ctx) + _safe(schedule_checks, ctx)
        return found + _safe(role_checks, ctx, Group.PERMISSIONS) + _safe(config.alert_rules, ctx)

    behaviour = [
        partial(_safe, check, ctx, Group.BEHAVIOUR) for check in (lease_semantics, visibility_semantics, run_probes)
    ]
    return run_verification(
        cloud="azure",
        target=ctx.target.description,
        mode=ctx.mode,
        local=ctx.target.local,
        clock=ctx.clock,
        cleanup=ctx.cleanup,
        progress=ctx.progress,
        steps=[configuration, *behaviour],
    )
