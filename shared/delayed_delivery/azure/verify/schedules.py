"""Recurring-schedule checks of ``azure verify``: the schedules table exists, and the schedule timer runs.

Schedules are on when the target says so (the app setting ``DELAYED_DELIVERY_SCHEDULES``, Bicep
``recurringSchedules``) or when the schedules table exists; otherwise both checks are skipped. The schedule timer writes
no heartbeat; what shows it runs is in storage: its first run makes one lease blob per schedule shard
(``schedules-NN`` in the delays container), and each run moves every due active schedule past now + lead, so an
active schedule whose next occurrence is older than the heartbeat's maximum age is one the timer is not writing. The
role check on the schedules table (``role-schedules``) is in ``roles.py``; it runs when these checks found schedules on
(``ctx.notes["schedules"]``).
"""

from __future__ import annotations

from datetime import timedelta

from azure.core.exceptions import AzureError, ResourceNotFoundError

from ...verification import CheckResult, Group, failed, passed, skipped, span
from ..schedules import rows
from ..schedules.store import TableScheduleStore
from ..schedules.timer import schedule_lease_name
from ..sdk_errors import translate
from .configuration import recreate
from .context import AzureVerifyContext

__all__ = ["schedule_checks"]

C = Group.CONFIGURATION
#: Overdue schedules named in a finding.
_SHOWN = 3


def schedule_checks(ctx: AzureVerifyContext) -> list[CheckResult]:
    """``schedules-table`` and ``schedule-timer``, or one skipped check when schedules are off."""
    name = ctx.target.schedules_table
    if not name:
        return []
    table = ctx.clients.tables.get_table_client(name)
    try:
        next(iter(table.query_entities("PartitionKey ne ''", results_per_page=1).by_page()), None)
    except ResourceNotFoundError:
        ctx.notes["schedules"] = ctx.target.schedules_on
        if not ctx.target.schedules_on:
            return [
                skipped(
                    "schedules-table",
                    C,
                    name,
                    f"no schedules table {name!r}: recurring schedules are off (Bicep recurringSchedules); set "
                    "DELAYED_DELIVERY_SCHEDULES=true to require them",
                )
            ]
        return [
            failed(
                "schedules-table",
                C,
                name,
                f"the schedules table {name!r} does not exist: no schedule can be created, none fires",
                recreate(ctx, "table", name),
            ),
            failed("schedule-timer", C, "schedule timer", "no schedules table: the timer has never run", _start(ctx)),
        ]
    except AzureError as exc:
        raise translate(exc, f"reading table {name}") from exc
    ctx.notes["schedules"] = True
    found = passed("schedules-table", C, name, f"the schedules table {name!r} exists and can be read")
    return [found, _timer(ctx, TableScheduleStore(table))]


def _timer(ctx: AzureVerifyContext, store: TableScheduleStore) -> CheckResult:
    """The timer ran (its lease blobs) and writes what is due (no active schedule overdue past the heartbeat age)."""
    container = ctx.target.config.container_name
    if "container" in ctx.missing:
        return failed(
            "schedule-timer",
            C,
            "schedule timer",
            "no lease container: the schedule timer cannot run",
            "recreate the lease container first (the lease-container check)",
        )
    try:
        blobs = ctx.clients.blobs.get_container_client(container).list_blobs(name_starts_with="schedules-")
        leases = {b.name for b in blobs} & {schedule_lease_name(s) for s in range(rows.SHARDS)}
    except AzureError as exc:
        raise translate(exc, f"listing container {container}") from exc
    max_age = ctx.settings.heartbeat_max_age
    now = ctx.clock.now()
    overdue = store.due(now - timedelta(seconds=max_age), _SHOWN)
    if overdue:
        ages = [(s.schedule_id, (now - s.next_at).total_seconds()) for s in overdue if s.next_at is not None]
        said = ", ".join(f"{sid} due {span(max(0.0, age))} ago" for sid, age in ages)
        return failed(
            "schedule-timer",
            C,
            "schedule timer",
            f"active schedule(s) not written past their next occurrence for over {span(max_age)} ({said}): the "
            "schedule timer is not running, or fails on their shard",
            _start(ctx),
            overdue=len(overdue),
        )
    if not leases:
        never = f"no schedules-NN lease blob in {container}: the schedule timer has never run"
        return failed("schedule-timer", C, "schedule timer", never, _start(ctx))
    return passed(
        "schedule-timer",
        C,
        "schedule timer",
        f"{len(leases)} of {rows.SHARDS} schedule shard lease blob(s); no active schedule overdue by over "
        f"{span(max_age)}",
        lease_blobs=len(leases),
    )


def _start(ctx: AzureVerifyContext) -> str:
    """How to get the schedule timer running."""
    if ctx.target.local:
        return f"run it: {ctx.target.command('dispatch')} --schedules --seconds 1 (the function app: each minute)"
    return (
        "set the app setting DELAYED_DELIVERY_SCHEDULES=true (Bicep recurringSchedules=true), publish the function app "
        "and check it runs (Functions > materialize_schedules > Monitor); a shard it cannot read logs "
        "event=schedule_failed (the schedule-failures alert)"
    )
