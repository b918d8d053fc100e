"""``delayed-delivery schedule create|list|describe|pause|resume|backfill|delete`` on a route, and ``send --every``.

Routes (``app/routes/schedules.py``): ``--store sqlite:///…|postgresql://…``, ``--cloud aws`` (``--local`` for
moto) and ``--cloud azure --endpoint NAME`` (``--local`` for Azurite). ``create`` prints the next 5 fires and warns
when daylight saving decides one within the next year; ``describe`` lists the next fires with a note per DST
decision; ``pause`` cancels the materialized occurrences by id (on SQS they are already on their queue and are
delivered: it says so); ``resume`` goes on from now (the paused span counted ``skipped_paused``) or with
``--catch-up``; ``backfill`` writes ``[--from, --to)`` with the usual ids, due at once and paced by the release
caps, refusing what the cursor passed unless ``--again``.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Annotated, Any

import typer
from rich.table import Table

from delayed_delivery.app.cli.inputs import parse_headers, parse_instant, read_body
from delayed_delivery.app.cli.output import emit_json, instant, print_table, say, warn
from delayed_delivery.app.cli.route_options import RouteOptions, with_route_options
from delayed_delivery.app.cli.schedule_inputs import DayMatchOption, Dst, Zone, local_text, window_seconds
from delayed_delivery.app.routes.base import CloudOptions, UsageError
from delayed_delivery.app.routes.schedules import ScheduleRoute, open_schedule_route
from delayed_delivery.clock import SystemClock
from delayed_delivery.schedules.catchup import CatchUp
from delayed_delivery.schedules.days import parse_day_match
from delayed_delivery.schedules.model import MessageTemplate, Schedule, ScheduleDefinition, ScheduleState
from delayed_delivery.schedules.occurrences import Occurrence, expand, utc_text
from delayed_delivery.schedules.operations import ScheduleNotFoundError, backfill, pause, resume
from delayed_delivery.schedules.transitions import dst_decisions
from delayed_delivery.schedules.zones import tz_database

__all__ = ["create_schedule", "register_schedule_commands"]

#: Fires ``create`` prints, and ``describe`` lists.
CREATE_SHOWN = 5
DESCRIBE_SHOWN = 10
#: How far ahead ``create`` looks for daylight-saving decisions.
AHEAD = timedelta(days=366)


def _route(options: RouteOptions) -> ScheduleRoute:
    """The schedule route the options name (``--cloud`` wins over ``--store``)."""
    if options.bucket_name:
        raise UsageError("--bucket-name is for the time-bucket tier; schedules on AWS use their own table")
    if options.cloud is None:
        if options.local:
            raise UsageError("--local needs --cloud aws or --cloud azure")
        return open_schedule_route(None, options.store)
    cloud = CloudOptions(options.cloud, options.local, options.endpoint_url, options.region,
                         options.connection_string, options.endpoint)  # fmt: skip
    return open_schedule_route(cloud, None)


def _get(route: ScheduleRoute, schedule_id: str) -> Schedule:
    found = route.store.get(schedule_id)
    if found is None:
        raise ScheduleNotFoundError(f"no schedule {schedule_id!r} ({route.where})")
    return found


def _upcoming(schedule: Schedule, now: datetime, count: int) -> list[Occurrence]:
    """The next ``count`` occurrences at or after ``now`` (from the start when later), before the end."""
    d = schedule.definition
    found = []
    for o in expand(d.recurrence(), max(now, d.start), d.end, schedule_id=schedule.schedule_id,
                    max_jitter=d.jitter_seconds):  # fmt: skip
        found.append(o)
        if len(found) == count:
            break
    return found


def _fire_doc(o: Occurrence) -> dict[str, Any]:
    return {"nominal": utc_text(o.nominal), "fire_at": utc_text(o.fire_at), "id": o.id, "local": local_text(o.local),
            "note": o.note}  # fmt: skip


def _policy(d: ScheduleDefinition) -> str:
    c = d.catch_up
    return f"dst {d.dst}; catch-up {c.policy} {c.window_seconds:,} s / {c.limit:,}"


def schedule_doc(schedule: Schedule, now: datetime) -> dict[str, Any]:
    """A schedule as JSON: definition, template, state, cursor, counters, the next fire."""
    nxt = _upcoming(schedule, now, 1) if schedule.state is ScheduleState.ACTIVE else []
    t = schedule.template
    return {
        "id": schedule.schedule_id,
        **{k: v for k, v in schedule.definition.document().items() if k != "v"},
        "destination": t.destination,
        "headers": dict(t.headers),
        "body_bytes": len(t.body),
        "state": str(schedule.state),
        "cursor": utc_text(schedule.cursor) if schedule.cursor else None,
        "last_fired": utc_text(schedule.last_fired) if schedule.last_fired else None,
        "next_fire": _fire_doc(nxt[0]) if nxt else None,
        "fired": schedule.fired,
        "missed": schedule.missed,
        "skipped_paused": schedule.skipped_paused,
        "paused_at": utc_text(schedule.paused_at) if schedule.paused_at else None,
        "version": schedule.version,
    }


def create_schedule(
    options: RouteOptions,
    schedule_id: str | None,
    expression: str,
    to: str,
    body: bytes,
    headers: dict[str, str],
    *,
    zone: str = "UTC",
    dst: str = "auto",
    day_match: str = "or",
    start: str | None = None,
    end: str | None = None,
    jitter: int = 0,
    catch_up: str = "all",
    catch_up_window: str = "86400",
    catch_up_limit: int = 1000,
) -> None:
    """Create a schedule on the route; print it, its next 5 fires and the DST decisions of the next year."""
    now = SystemClock().now()
    definition = ScheduleDefinition(
        expression,
        start=parse_instant(start, "--start") if start else now.replace(microsecond=0),
        zone=zone,
        dst=dst,
        day_match=parse_day_match(day_match),
        end=parse_instant(end, "--end") if end else None,
        jitter_seconds=jitter,
        catch_up=CatchUp(catch_up, window_seconds(catch_up_window), catch_up_limit),  # type: ignore[arg-type]
    )
    sid = schedule_id or f"s-{uuid.uuid4().hex[:12]}"
    schedule = Schedule.new(sid, definition, MessageTemplate(to, body, headers))
    route = _route(options)
    route.check(schedule)
    route.store.create(schedule)
    upcoming = _upcoming(schedule, now, CREATE_SHOWN)
    decisions = dst_decisions(definition.recurrence(), max(now, definition.start), max(now, definition.start) + AHEAD)
    if definition.end is not None:
        decisions = [f for f in decisions if f.nominal < definition.end]
    if options.as_json:
        emit_json({
            "schedule": schedule_doc(schedule, now),
            "route": route.name,
            "next": [_fire_doc(o) for o in upcoming],
            "dst_warnings": [{"nominal": utc_text(f.nominal), "local": local_text(f.local), "note": f.note}
                             for f in decisions],
        })  # fmt: skip
        return
    say(f"created schedule {sid}: {definition.recurrence().describe()} → {to} (route: {route.name}, {route.where})")
    _print_fires(f"next {len(upcoming)}", upcoming)
    for f in decisions[:10]:
        warn(f"daylight saving within the next year: {f.note} ({utc_text(f.nominal)})")
    if len(decisions) > 10:
        warn(f"… and {len(decisions) - 10} more daylight-saving decisions in the next year (`schedule describe`)")


def _print_fires(title: str, fires: list[Occurrence]) -> None:
    table = Table(title=title, caption=f"time zones: {tz_database().describe()}")
    for column in ("nominal (UTC)", "fires at (UTC)", "local", "id", "note"):
        table.add_column(column)
    for o in fires:
        table.add_row(utc_text(o.nominal), utc_text(o.fire_at), local_text(o.local), o.id or "-", o.note or "")
    print_table(table)


ScheduleId = Annotated[str, typer.Argument(help="The schedule id (1-100 letters, digits, _ . : -).")]


def create(
    route: RouteOptions,
    schedule_id: ScheduleId,
    expression: Annotated[str, typer.Argument(help="cron fields (5), rate(N unit) or at(time).")],
    to: Annotated[str, typer.Option("--to", help="Destination queue of every occurrence.")],
    body: Annotated[str, typer.Option("--body", help="Body text, or @FILE to read bytes from a file.")],
    header: Annotated[list[str] | None, typer.Option("--header", "-H", help="Header key=value (repeatable).")] = None,
    zone: Zone = "UTC",
    dst: Dst = "auto",
    day_match: DayMatchOption = "or",
    start: Annotated[str | None, typer.Option("--start", help="First instant (ISO-8601; default now).")] = None,
    end: Annotated[str | None, typer.Option("--end", help="No fire at or after this instant.")] = None,
    jitter: Annotated[int, typer.Option("--jitter", help="Deterministic jitter, at most seconds.")] = 0,
    catch_up: Annotated[str, typer.Option("--catch-up", help="After downtime: all, latest or skip.")] = "all",
    catch_up_window: Annotated[str, typer.Option("--catch-up-window", help="Seconds or e.g. 24h.")] = "86400",
    catch_up_limit: Annotated[int, typer.Option("--catch-up-limit", help="all: the most recent N.")] = 1000,
) -> None:
    """Create a recurring schedule; prints the next 5 fires and warns about daylight saving within a year.

    Examples:
      delayed-delivery schedule create daily-report '0 9 * * MON-FRI' --tz Europe/Berlin --to reports
        --body '{"run": "daily"}' --store sqlite:///delays.db
      delayed-delivery schedule create sweep 'rate(15 minutes)' --to jobs --body sweep --cloud aws --local
    """
    create_schedule(route, schedule_id, expression, to, read_body(body), parse_headers(header or []), zone=zone,
                    dst=dst, day_match=day_match, start=start, end=end, jitter=jitter, catch_up=catch_up,
                    catch_up_window=catch_up_window, catch_up_limit=catch_up_limit)  # fmt: skip


def list_schedules(
    route: RouteOptions,
    after: Annotated[str | None, typer.Option("--after", help="List the ids after this one (paging).")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000, help="At most this many.")] = 100,
) -> None:
    """List schedules: expression, zone, policy, state, last fired, next fire (UTC and local), missed."""
    opened = _route(route)
    now = SystemClock().now()
    found = list(opened.store.list(after, limit))
    if route.as_json:
        emit_json({"schedules": [schedule_doc(s, now) for s in found], "route": opened.name})
        return
    table = Table(title=f"schedules ({opened.where})")
    for column in ("id", "expression", "zone", "policy", "state", "last fired", "next fire (UTC)", "next (local)",
                   "missed"):  # fmt: skip
        table.add_column(column, justify="right" if column == "missed" else "left")
    for s in found:
        nxt = _upcoming(s, now, 1) if s.state is ScheduleState.ACTIVE else []
        table.add_row(
            s.schedule_id,
            s.definition.expression,
            s.definition.zone,
            _policy(s.definition),
            str(s.state),
            instant(s.last_fired),
            utc_text(nxt[0].fire_at) if nxt else "-",
            local_text(nxt[0].local) if nxt else "-",
            str(s.missed),
        )
    if len(found) == limit:
        table.caption = f"more after {found[-1].schedule_id}: --after {found[-1].schedule_id}"
    print_table(table)


def describe(route: RouteOptions, schedule_id: ScheduleId) -> None:
    """Show a schedule: its definition, state and counters, the next fires with DST notes, what is materialized."""
    opened = _route(route)
    now = SystemClock().now()
    s = _get(opened, schedule_id)
    upcoming = _upcoming(s, now, DESCRIBE_SHOWN) if s.state is ScheduleState.ACTIVE else []
    d = s.definition
    decisions = dst_decisions(d.recurrence(), max(now, d.start), max(now, d.start) + AHEAD)
    materialized = opened.materialized(s, now)
    if route.as_json:
        emit_json({
            **schedule_doc(s, now),
            "next": [_fire_doc(o) for o in upcoming],
            "dst_decisions": [{"nominal": utc_text(f.nominal), "local": local_text(f.local), "note": f.note}
                              for f in decisions],
            "materialized": [{"id": m.occurrence_id, "fire_at": utc_text(m.fire_at), "where": m.where}
                             for m in materialized],
            "time_zones": tz_database().describe(),
        })  # fmt: skip
        return
    say(f"schedule {s.schedule_id} ({opened.name}, {opened.where}): {d.recurrence().describe()} → "
        f"{s.template.destination}")  # fmt: skip
    say(f"state {s.state}; {_policy(d)}; jitter {d.jitter_seconds} s; window [{utc_text(d.start)}, "
        f"{utc_text(d.end) if d.end else '∞'})")  # fmt: skip
    say(f"fired {s.fired}, missed {s.missed}, skipped while paused {s.skipped_paused}; last fired "
        f"{instant(s.last_fired)}; cursor {instant(s.cursor)}")  # fmt: skip
    if upcoming:
        _print_fires(f"next {len(upcoming)}", upcoming)
    for f in decisions:
        say(f"daylight saving: {f.note} ({utc_text(f.nominal)})")
    for m in materialized:
        say(f"materialized: {m.occurrence_id} fires {utc_text(m.fire_at)} ({m.where})")


def pause_schedule(route: RouteOptions, schedule_id: ScheduleId) -> None:
    """Pause: nothing more is materialized; the occurrences materialized and not yet due are cancelled by id."""
    opened = _route(route)
    result = pause(opened.store, opened.canceller(), schedule_id, SystemClock().now())
    on_way = _on_the_way(opened, result.in_flight)
    if route.as_json:
        emit_json({"id": schedule_id, "state": str(result.schedule.state), "cancelled": list(result.cancelled),
                   "not_cancelled": list(result.in_flight), "not_found": list(result.not_found)})  # fmt: skip
        return
    say(f"paused {schedule_id}: {len(result.cancelled)} materialized occurrence(s) cancelled")
    if on_way:
        warn(on_way)


def _on_the_way(route: ScheduleRoute, ids: tuple[str, ...]) -> str:
    """What to say about occurrences that could not be cancelled."""
    if not ids:
        return ""
    listed = ", ".join(ids[:5]) + (f" … ({len(ids)})" if len(ids) > 5 else "")
    if route.name == "aws":
        return (f"{len(ids)} occurrence(s) already wait on their queue with their DelaySeconds (SQS cannot withdraw a "
                f"delayed message): they are delivered: {listed}")  # fmt: skip
    return f"{len(ids)} occurrence(s) were being sent and are delivered: {listed}"


def resume_schedule(
    route: RouteOptions,
    schedule_id: ScheduleId,
    catch_up: Annotated[
        bool, typer.Option("--catch-up", help="Apply the catch-up policy to the paused span instead of skipping it.")
    ] = False,
) -> None:
    """Resume from now: the paused span's occurrences are counted skipped_paused (or caught up with --catch-up)."""
    opened = _route(route)
    now = SystemClock().now()
    before = _get(opened, schedule_id)
    resumed = resume(opened.store, schedule_id, now, catch_up=catch_up)
    skipped, missed = resumed.skipped_paused - before.skipped_paused, resumed.missed - before.missed
    if route.as_json:
        emit_json({"id": schedule_id, "state": str(resumed.state), "skipped_paused": skipped, "missed": missed,
                   "catch_up": catch_up, "next_fire": schedule_doc(resumed, now)["next_fire"]})  # fmt: skip
        return
    how = "the catch-up policy applies to the paused span" if catch_up else f"{skipped} occurrence(s) skipped_paused"
    if missed:
        how += f"; {missed} due before the pause and never written recorded as missed"
    say(f"resumed {schedule_id}: {how}")


def backfill_schedule(
    route: RouteOptions,
    schedule_id: ScheduleId,
    start: Annotated[str, typer.Option("--from", help="First instant (ISO-8601), included.")],
    end: Annotated[str, typer.Option("--to", help="Last instant (ISO-8601), excluded; at most now.")],
    again: Annotated[bool, typer.Option("--again", help="Also send what the cursor already passed.")] = False,
) -> None:
    """Write the occurrences in [--from, --to) with their usual ids, due at once (paced by the release caps)."""
    opened = _route(route)
    writer = opened.backfill_writer()
    now = SystemClock().now()
    start_at, end_at = parse_instant(start, "--from"), parse_instant(end, "--to")
    result = backfill(opened.store, writer, schedule_id, start_at, end_at, now, again=again)
    refused = writer.flush()
    written = [i for i in result.written if i not in set(refused)]
    if route.as_json:
        emit_json({"id": schedule_id, "written": written, "left_to_timer": result.left_to_timer,
                   "already_pending": list(result.conflicts), "not_sent": refused})  # fmt: skip
    else:
        say(f"backfilled {schedule_id}: {len(written)} occurrence(s) written; {result.left_to_timer} after the "
            f"cursor left to the timer; {len(result.conflicts)} already pending with other content")  # fmt: skip
    if refused:
        raise typer.Exit(code=1)


def delete_schedule(route: RouteOptions, schedule_id: ScheduleId) -> None:
    """Delete a schedule; its materialized occurrences not yet due are cancelled first."""
    opened = _route(route)
    _get(opened, schedule_id)
    paused = pause(opened.store, opened.canceller(), schedule_id, SystemClock().now())
    gone = opened.store.delete(schedule_id)
    on_way = _on_the_way(opened, paused.in_flight)
    if route.as_json:
        emit_json({"id": schedule_id, "deleted": gone, "cancelled": list(paused.cancelled),
                   "not_cancelled": list(paused.in_flight)})  # fmt: skip
        return
    say(f"deleted {schedule_id}: {len(paused.cancelled)} materialized occurrence(s) cancelled")
    if on_way:
        warn(on_way)


def register_schedule_commands(app: typer.Typer) -> None:
    """Add the route commands to the ``schedule`` group."""
    for name, command in (
        ("create", create),
        ("list", list_schedules),
        ("describe", describe),
        ("pause", pause_schedule),
        ("resume", resume_schedule),
        ("backfill", backfill_schedule),
        ("delete", delete_schedule),
    ):
        app.command(name)(with_route_options(command))
