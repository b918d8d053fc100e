"""``delayed-delivery schedule next|catch-up``: preview a recurring schedule without any cloud or store.

The commands that act on a route (``create|list|describe|pause|resume|backfill|delete``) are in ``schedule_ops.py``
and join this group at the end of this module.

``next`` lists the first N nominal instants at or after ``--from`` (before ``--until``) with their fire times,
local times, occurrence ids and a note for each daylight-saving decision; ``catch-up`` shows what the timer does
on recovery after downtime. Scripts depend on the ``--json`` shapes; a bad expression, zone or option exits 2 with
one line.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer
from rich.table import Table

from delayed_delivery.app.cli.inputs import parse_instant
from delayed_delivery.app.cli.output import emit_json, fail, print_table, say
from delayed_delivery.app.cli.schedule_inputs import DayMatchOption, Dst, Zone, local_text, window_seconds
from delayed_delivery.errors import DelayedDeliveryError, InvalidScheduleError
from delayed_delivery.schedules.catchup import CatchUp, CatchUpPlan, plan_catch_up
from delayed_delivery.schedules.days import parse_day_match
from delayed_delivery.schedules.occurrences import Occurrence, expand, utc_text
from delayed_delivery.schedules.recurrence import Fire, Recurrence
from delayed_delivery.schedules.zones import tz_database

__all__ = ["schedule_app"]

#: The most fires ``next`` lists.
MAX_COUNT = 100_000
#: Rows of each list the table form of ``catch-up`` prints (``--json`` has every one).
SHOWN = 20

schedule_app = typer.Typer(
    name="schedule",
    help="Recurring schedules: create and operate them on a route (--store, --cloud aws); preview the next fires "
    "and what catch-up does (next, catch-up: no cloud or store needed).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

F = TypeVar("F", bound=Callable[..., None])


def _one_line_errors(command: F) -> F:
    """Library errors (a bad expression, zone, instant or option) as one ``error:`` line, exit 2."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        try:
            command(*args, **kwargs)
        except DelayedDeliveryError as exc:
            raise fail(str(exc)) from None

    return wrapper  # type: ignore[return-value]


Expression = Annotated[str, typer.Argument(help="cron fields (5), rate(N unit) or at(time), e.g. '30 2 * * *'.")]
Json = Annotated[bool, typer.Option("--json", help="Print one JSON document for scripts.")]


@schedule_app.command("next")
@_one_line_errors
def next_fires(
    expression: Expression,
    start: Annotated[str, typer.Option("--from", help="Instant, ISO-8601 with Z or an offset; a rate's anchor.")],
    count: Annotated[int, typer.Option("--count", help="How many fires to list.")],
    zone: Zone = "UTC",
    until: Annotated[str | None, typer.Option("--until", help="List only fires before this instant.")] = None,
    dst: Dst = "auto",
    day_match: DayMatchOption = "or",
    schedule_id: Annotated[
        str | None, typer.Option("--id", help="Schedule id: show each occurrence's id (<id>@<nominal>).")
    ] = None,
    jitter: Annotated[int, typer.Option("--jitter", help="Max jitter in seconds (needs --id).")] = 0,
    as_json: Json = False,
) -> None:
    """The first COUNT nominal instants at or after --from (and before --until), in order, with DST notes.

    Example: delayed-delivery schedule next '30 2 * * *' --tz America/New_York --from 2027-03-13T00:00:00Z --count 3
    """
    if not 1 <= count <= MAX_COUNT:
        raise InvalidScheduleError(f"--count must be from 1 to {MAX_COUNT:,}, got {count}")
    begin = parse_instant(start, "--from")
    end = parse_instant(until, "--until") if until is not None else None
    recurrence = Recurrence(expression, zone, dst=dst, day_match=parse_day_match(day_match), anchor=begin)
    fires: list[Occurrence] = []
    for occurrence in expand(recurrence, begin, end, schedule_id=schedule_id, max_jitter=jitter):
        fires.append(occurrence)
        if len(fires) == count:
            break
    if as_json:
        emit_json({"fires": [_fire_json(o) for o in fires]})
        return
    table = Table(
        title=f"next {len(fires)} of {recurrence.describe()}", caption=f"time zones: {tz_database().describe()}"
    )
    for column in ("nominal (UTC)", "fires at (UTC)", "local", "id", "note"):
        table.add_column(column)
    for o in fires:
        table.add_row(utc_text(o.nominal), utc_text(o.fire_at), local_text(o.local), o.id or "-", o.note or "")
    print_table(table)


def _fire_json(o: Occurrence) -> dict[str, object]:
    return {
        "nominal": utc_text(o.nominal),
        "fire_at": utc_text(o.fire_at),
        "id": o.id,
        "local": local_text(o.local),
        "note": o.note,
    }


@schedule_app.command("catch-up")
@_one_line_errors
def catch_up(
    expression: Expression,
    last_fired: Annotated[
        str, typer.Option("--last-fired", help="The last occurrence fired (the cursor); a rate's anchor.")
    ],
    recovered: Annotated[str, typer.Option("--recovered", help="When the timer runs again.")],
    policy: Annotated[str, typer.Option("--policy", help="all, latest or skip.")],
    zone: Zone = "UTC",
    window: Annotated[
        str, typer.Option("--window", help="Fire only occurrences at most this old at recovery: seconds or 24h.")
    ] = "86400",
    limit: Annotated[int, typer.Option("--limit", help="all: fire at most the most recent N.")] = 1000,
    dst: Dst = "auto",
    day_match: DayMatchOption = "or",
    as_json: Json = False,
) -> None:
    """What the timer does after downtime: the occurrences it fires late, those it records as missed, and the next.

    Example: delayed-delivery schedule catch-up '0 * * * *' --last-fired 2027-01-01T00:00:00Z
    --recovered 2027-01-03T12:00:00Z --policy latest
    """
    cursor = parse_instant(last_fired, "--last-fired")
    rule = CatchUp(policy, window_seconds(window), limit)  # type: ignore[arg-type]  # checked by CatchUp
    recurrence = Recurrence(expression, zone, dst=dst, day_match=parse_day_match(day_match), anchor=cursor)
    plan = plan_catch_up(recurrence, cursor, parse_instant(recovered, "--recovered"), rule)
    if as_json:
        emit_json(
            {
                "fire_late": [{"nominal": utc_text(f.nominal)} for f in plan.fire_late],
                "missed": [{"nominal": utc_text(f.nominal)} for f in plan.missed],
                "next": {"nominal": utc_text(plan.next.nominal)} if plan.next is not None else None,
            }
        )
        return
    _print_plan(plan, recurrence, rule)


def _print_plan(plan: CatchUpPlan, recurrence: Recurrence, rule: CatchUp) -> None:
    table = Table(
        title=f"catch-up of {recurrence.describe()}: policy {rule.policy}, window {rule.window_seconds:,} s, "
        f"limit {rule.limit:,}",
        caption=f"{len(plan.fire_late):,} fire late (due at once, nominal ids), {len(plan.missed):,} recorded as "
        "missed; --json lists every one",
    )
    for column in ("nominal (UTC)", "local", "decision"):
        table.add_column(column)
    for decision, fires in (("fire late", plan.fire_late), ("missed", plan.missed)):
        for f in _ends(fires):
            table.add_row(*(_row(f, decision) if f is not None else ("…", "", f"{len(fires) - 2 * SHOWN:,} more")))
    if plan.next is not None:
        table.add_row(*_row(plan.next, "next"))
    print_table(table)
    if not plan.fire_late and not plan.missed:
        say("nothing was missed")


def _ends(fires: tuple[Fire, ...]) -> list[Fire | None]:
    """The first and last ``SHOWN`` of ``fires``, None standing for the ones between."""
    if len(fires) <= 2 * SHOWN:
        return list(fires)
    return [*fires[:SHOWN], None, *fires[-SHOWN:]]


def _row(f: Fire, decision: str) -> tuple[str, str, str]:
    return utc_text(f.nominal), local_text(f.local), decision if f.note is None else f"{decision} ({f.note})"


def _register() -> None:
    from delayed_delivery.app.cli.schedule_ops import register_schedule_commands

    register_schedule_commands(schedule_app)


_register()
