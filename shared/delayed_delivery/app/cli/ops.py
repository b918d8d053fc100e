"""Operator commands: send, pending, cancel and reschedule on a SQL store (``--store``) or a cloud (``--cloud``).

Routes: ``--store sqlite:///…|postgresql://…`` (exact), ``--cloud azure`` (the endpoint's delays table: exact;
native sends ≤ 7 days are not in it), ``--cloud aws`` (send through the delayed sender; pending from queue
attributes, approximate; cancel and reschedule write a record the requeue function applies at the next hop),
``--cloud aws --bucket-name B`` (with the S3 time-bucket tier: its messages counted exactly from the object listing,
records kept until the timer applies them).
``--local`` points a cloud route at the local emulators (moto server on 127.0.0.1:5000, Azurite on 10000-10002;
``delayed-delivery local up`` starts them there).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from delayed_delivery.app.cli.id_argument import TakesAnId
from delayed_delivery.app.cli.inputs import parse_headers, parse_instant, read_body
from delayed_delivery.app.cli.output import emit_json, fail, instant, out, print_table, say, warn
from delayed_delivery.app.cli.route_options import RouteOptions, with_route_options
from delayed_delivery.app.routes import (  # no cloud SDK at import: the routes import theirs when used
    CancelRequest,
    PendingReport,
    RescheduleRequest,
    UsageError,
    check_pending,
    check_request,
)
from delayed_delivery.app.routes.buckets import BucketPendingReport
from delayed_delivery.cancellations import UnreadableRecord
from delayed_delivery.clock import SystemClock
from delayed_delivery.durations import MAX_DELAY, format_duration, to_seconds
from delayed_delivery.errors import (
    InvalidMessageError,
)
from delayed_delivery.release import DEFAULT_KEY, RELEASE_RATES_ENV, ReleaseRates
from delayed_delivery.settings import DelayedDeliverySettings

if TYPE_CHECKING:
    from delayed_delivery.aws.tier.relocate import ScanProgress

__all__ = ["UsageError", "register_operator_commands"]


DelayOption = Annotated[str | None, typer.Option("--delay", "-d", help="Delay from now, e.g. 90s, 2h, 40d, 1y.")]
AtOption = Annotated[str | None, typer.Option("--at", help="Due time, ISO-8601 with a time zone.")]
ToOption = Annotated[
    str | None,
    typer.Option("--to", help="aws: the destination queue the message was sent to (its -delay.fifo hop cycle)."),
]


def _due(delay: str | None, at: str | None, *, sending: bool = False) -> datetime:
    if (delay is None) == (at is None):
        raise UsageError("give exactly one of --delay or --at")
    if delay is not None:
        return SystemClock().now() + timedelta(seconds=to_seconds(delay))
    assert at is not None
    due, now = parse_instant(at, "--at"), SystemClock().now()
    if due - now > MAX_DELAY:  # reschedule too: the routes check only what they store
        raise InvalidMessageError(
            f"due time {due.isoformat()} is more than the 100-year maximum after now ({now.isoformat()})"
        )
    if sending and due < now:  # a reschedule into the past is refused by every route instead
        ago = format_duration(round((now - due).total_seconds()))
        warn(f"--at {at} is {ago} in the past: it is due now (it goes out at once)")
    return due


def _new_due(delay: str | None, at: str | None) -> datetime | timedelta:
    """``reschedule``'s new due time, later than now on every route: ``--delay`` stays a delay, which the route counts
    from its write (so ``--delay 1s`` is not used up while the command connects); ``--at`` a moment, checked now."""
    if delay is not None and at is None:
        seconds = to_seconds(delay)
        if seconds <= 0:
            raise InvalidMessageError(f"--delay {delay}: the new due time must be later than now (or cancel it)")
        return timedelta(seconds=seconds)
    due, now = _due(delay, at), SystemClock().now()
    if due <= now:
        raise InvalidMessageError(
            f"new due time {due.isoformat()} is in the past (now {now.isoformat()}): give a later --at or a --delay, "
            "or cancel it"
        )
    return due


def send(
    route: RouteOptions,
    to: Annotated[str, typer.Option("--to", help="Destination queue.")],
    body: Annotated[str, typer.Option("--body", help="Body text, or @FILE to read bytes from a file.")],
    delay: DelayOption = None,
    at: AtOption = None,
    header: Annotated[list[str] | None, typer.Option("--header", "-H", help="Header key=value (repeatable).")] = None,
    message_id: Annotated[str | None, typer.Option("--id", help="Message id (default: a new UUID).")] = None,
    cancellable: Annotated[
        bool, typer.Option("--cancellable", help="azure: keep it in the delays table even if ≤ 7 days.")
    ] = False,
    every: Annotated[
        str | None,
        typer.Option(
            "--every",
            help="Send it on a recurring schedule instead (cron, rate(...) or at(...)); --id "
            "names the schedule. Shortcut of `schedule create`.",
        ),
    ] = None,
    tz: Annotated[str, typer.Option("--tz", help="With --every: the schedule's IANA time zone.")] = "UTC",
) -> None:
    """Send a delayed message; prints its id and the route it took (--every: a recurring schedule instead).

    Examples:
      delayed-delivery send --cloud aws --local --to orders --delay 40d --body '{"id": 1}'
      delayed-delivery send --cloud azure --local --endpoint shop --to orders --at 2027-01-31T09:00:00Z --body @o.json
      delayed-delivery send --store sqlite:///delays.db --to orders --delay 2h --body hello -H type=Reminder
      delayed-delivery send --store sqlite:///delays.db --to reports --every '0 9 * * *' --tz Europe/Berlin --body hi
    """
    if every is not None:
        if delay is not None or at is not None or cancellable:
            raise UsageError("--every makes a recurring schedule: give no --delay, --at or --cancellable with it")
        from delayed_delivery.app.cli.schedule_ops import create_schedule

        create_schedule(route, message_id, every, to, read_body(body), parse_headers(header or []), zone=tz)
        return
    due = _due(delay, at, sending=True)
    payload, headers = read_body(body), parse_headers(header or [])
    result = route.open().send(
        to, payload, due, headers=headers, message_id=message_id, delay=delay, cancellable=cancellable
    )
    text = f"{result.message_id}  → {to} at {instant(result.due_at)} (route: {result.route})"
    route.print(result.as_dict(), text)


def pending(
    route: RouteOptions,
    by: Annotated[str, typer.Option("--by", help="Bucket the backlog by hour or day.")] = "day",
    queue: Annotated[str | None, typer.Option("--queue", help="aws: only this endpoint's queues.")] = None,
) -> None:
    """Show the backlog by due hour or day, the next due time and the oldest overdue message.

    Exact for SQL stores and the Azure delays table; on SQS, approximate counts from queue attributes; with the
    S3 time-bucket tier (--bucket-name), exact counts of the tier's messages from the object listing.

    Examples:
      delayed-delivery pending --store sqlite:///delays.db --by hour
      delayed-delivery pending --cloud azure --local --endpoint shop --json
      delayed-delivery pending --cloud aws --local
      delayed-delivery pending --cloud aws --local --bucket-name delays --by hour
    """
    if by not in ("hour", "day"):
        raise UsageError("--by must be hour or day")
    rates = DelayedDeliverySettings.from_env(os.environ).release_rates  # what the dispatchers read
    opened = route.open()
    check_pending(opened, queue)
    report = opened.pending(3600 if by == "hour" else 86_400, queue=queue)
    if route.as_json:
        emit_json({**report.as_dict(), **({"release_rates": rates.as_dict()} if rates else {})})
        return
    if isinstance(report, BucketPendingReport):
        _print_tier(report, by)
    elif report.queues is not None:
        _print_queue_depths(report)
    else:
        _print_backlog(report, by)
    if rates:
        say(release_line(rates))


def release_line(rates: ReleaseRates) -> str:
    """The caps in force, one line: each capped destination's rate, the default's, the destinations it spares."""
    named = [f"{name} {rate:g}/s" for name, rate in rates.rates if name != DEFAULT_KEY and rate is not None]
    default = rates.rate_for(DEFAULT_KEY) if DEFAULT_KEY in rates.as_dict() else None
    if default is not None:
        named.append(f"every other destination {default:g}/s")
    spared = [name for name, rate in rates.rates if rate is None and name != DEFAULT_KEY]
    if spared and default is not None:
        named.append(f"not capped: {', '.join(spared)}")
    return f"release control ({RELEASE_RATES_ENV}): {'; '.join(named)}"


def _print_queue_depths(report: PendingReport) -> None:
    """The SQS form, under its own heading: approximate counts of SQS messages per endpoint, no due times."""
    counts = report.approximate
    table = Table(title="approximate: SQS queue attributes, in SQS messages (an envelope counts once)")
    for col in ("queue", "in the -delay.fifo hop cycle", "final native delay", "ready at destination"):
        table.add_column(col, justify="left" if col == "queue" else "right")
    for q in report.queues or ():
        table.add_row(q.queue, str(q.hop_cycle), str(q.final_native_delay), str(q.ready_at_destination))
    print_table(table)
    if counts is not None:
        if counts.ingest_queue is not None:
            failed = counts.ingest_dlq_sqs_messages
            dlq = f", {failed} in its dead-letter queue" if failed else ""
            say(
                f"ingest queue {counts.ingest_queue}: {counts.ingest_sqs_messages} SQS message(s) on their way into "
                f"the time-bucket tier{dlq}"
            )
        say(
            f"still to deliver through SQS: {counts.sqs_messages} SQS message(s), so at least {counts.sqs_messages} "
            f"message(s) (an envelope holds up to {counts.envelope_max_messages:,})"
        )
    _print_error_queue(report)
    _print_limits(report)


def _print_backlog(report: PendingReport, by: str) -> None:
    """The exact form: totals, then a bar per due bucket (at most 48; --json has all)."""
    overdue = report.oldest_overdue_seconds
    claimed = f"   claimed or retrying: {report.claimed_or_retrying}" if report.claimed_or_retrying is not None else ""
    if report.placed:
        claimed += f"   placed on their queues, hidden until due: {report.placed}"
    say(
        f"pending: {report.pending}   next due: {instant(report.next_due)}   "
        f"oldest overdue: {format_duration(overdue) if overdue else '-'}{claimed}"
    )
    backlog = report.backlog or ()
    table = Table(title=f"backlog by due {by}")
    table.add_column(by)
    table.add_column("messages", justify="right")
    table.add_column("")
    peak = max((b.count for b in backlog), default=1)
    for b in backlog[:48]:
        label = b.start.strftime("%Y-%m-%d %H:00" if by == "hour" else "%Y-%m-%d")
        table.add_row(label, str(b.count), "█" * max(1, round(30 * b.count / peak)))
    if len(backlog) > 48:
        table.caption = f"… {len(backlog) - 48} more buckets (use --json for all)"
    print_table(table)
    _print_error_queue(report)
    _print_limits(report)


def _print_tier(report: BucketPendingReport, by: str) -> None:
    """AWS with the time-bucket tier: the tier's exact table, its live records, then the FIFO route's counts."""
    assert report.census is not None
    census, overdue = report.census, report.census.oldest_overdue
    late = f"{_bucket_text(overdue)}, {format_duration(census.oldest_overdue_seconds)} past its end" if overdue else "-"
    say(
        f"exact: time-bucket tier s3://{report.bucket_name}/{report.prefix}: {census.describe_total()} message(s) in "
        f"{census.objects} object(s) ({census.fine_messages} in fine buckets, {census.coarse_messages} in coarse)\n"
        f"next due bucket: {_bucket_text(census.next_due)}   oldest overdue: {late}"
    )
    table = Table(title=f"tier by due {by} (exact)")
    for col in (by, "messages", "fine", "coarse", "objects"):
        table.add_column(col, justify="left" if col == by else "right")
    for row in census.rows[:48]:
        label = row.start.strftime("%Y-%m-%d %H:00" if by == "hour" else "%Y-%m-%d")
        count = f"≥ {row.messages}" if row.uncounted_objects else str(row.messages)
        table.add_row(label, count, str(row.fine_messages), str(row.coarse_messages), str(row.objects))
    if len(census.rows) > 48:
        table.caption = f"… {len(census.rows) - 48} more rows (use --json for all)"
    print_table(table)
    for plan in report.in_flight:
        say(
            f"sending now: fine {instant(plan.bucket.start)}: {plan.done}/{plan.partitions} partitions done, "
            f"{plan.working} worker(s) on it, {plan.sent} message(s) sent so far"
        )
    more = " (more not listed)" if report.records_truncated else ""
    say(f"cancel / reschedule records waiting: {len(report.records)}{more}")
    for r in report.records[:20]:
        if isinstance(r, UnreadableRecord):
            say(f"  unreadable {r.message_id} on {r.endpoint}: {r.reason} (its message goes to the error queue)")
            continue
        moved = f" → {instant(r.due_at)}" if r.due_at else ""
        say(f"  {r.kind.value} {r.message_id} on {r.endpoint}{moved}")
    if report.queues or (report.approximate is not None and report.approximate.ingest_queue is not None):
        _print_queue_depths(report)
        return
    _print_error_queue(report)
    _print_limits(report)


def _bucket_text(bucket: Any) -> str:
    return "-" if bucket is None else f"{bucket.level} {instant(bucket.start)}"


def _print_error_queue(report: PendingReport) -> None:
    if report.error_queue_messages is not None:
        say(f"error queue {report.error_queue!r}: {report.error_queue_messages} message(s)")


def _print_limits(report: PendingReport) -> None:
    if report.limits is not None:
        out.print(Text(f"limits: {report.limits}", style="dim"), soft_wrap=True)


def cancel(
    route: RouteOptions,
    message_id: Annotated[str, typer.Argument(help="The message id to cancel.")],
    to: ToOption = None,
    due: Annotated[
        str | None,
        typer.Option(
            "--due",
            "--at",
            help="aws: the message's due time (ISO-8601), if known: says for sure if it is too late.",
        ),
    ] = None,
) -> None:
    """Cancel a delayed message that has not been delivered yet (SQL stores and the Azure table: exact).

    On Azure a message being sent is refused (exit 1: try again shortly), and so is one a dispatcher may already
    have put on its queue without recording it (exit 1: it is delivered; never reported cancelled).

    On SQS a record is written and the message is dropped at its next hop, unless it already waits out its
    final native delay (due within 15 minutes). With the time-bucket tier (--bucket-name) the record is kept until
    the message's bucket is dispatched; --at warns when it may already be on its way.

    Examples:
      delayed-delivery cancel 3f2c… --store sqlite:///delays.db
      delayed-delivery cancel 3f2c… --cloud azure --local --endpoint shop
      delayed-delivery cancel 3f2c… --cloud aws --local --to orders [--due 2027-01-31T09:00:00Z]
    """
    opened = route.open()
    request = CancelRequest(message_id, to=to, due=parse_instant(due, "--due") if due is not None else None)
    check_request(opened, request)
    result = opened.cancel(request)
    if result.record is not None:
        if result.warning:
            warn(result.warning)
        route.print(result.as_dict(), f"cancel of {message_id} accepted (route: aws): {result.record.note}")
        return
    if not result.cancelled:
        raise UsageError(f"no pending message {message_id!r} {_GONE[result.route]}")
    route.print(result.as_dict(), f"cancelled {message_id} (route: {result.route})")


def reschedule(
    route: RouteOptions,
    message_id: Annotated[str, typer.Argument(help="The message id to move.")],
    delay: DelayOption = None,
    at: AtOption = None,
    to: ToOption = None,
    due: Annotated[
        str | None,
        typer.Option("--due", help="time-bucket tier: the message's current due time (ISO-8601), if known."),
    ] = None,
    scan_limit: Annotated[
        int | None,
        typer.Option("--scan-limit", min=1, help="time-bucket tier, without --due: read at most this many objects."),
    ] = None,
    keep_record: Annotated[
        bool, typer.Option("--keep-record", help="time-bucket tier: keep the record until the due time, found or not.")
    ] = False,
) -> None:
    """Move a pending message to a new due time (SQL stores, the Azure table and the time-bucket tier: exact).

    On SQS a record is written and the message moves at its next hop, unless it already waits out its final
    native delay (due within 15 minutes). With the time-bucket tier (--bucket-name) the message is found and moved
    now, under its bucket's lease: --due (its current due time) reads only its buckets, else every object (at most
    --scan-limit). Exit 1 when it is not in the tier or its bucket is being dispatched (try again).

    Examples:
      delayed-delivery reschedule 3f2c… --delay 3d --store sqlite:///delays.db
      delayed-delivery reschedule 3f2c… --at 2027-06-01T08:00:00Z --cloud azure --local --endpoint shop
      delayed-delivery reschedule 3f2c… --delay 2h --cloud aws --local --to orders --bucket-name delays [--due …]
    """
    new_due = _new_due(delay, at)
    opened = route.open()
    request = RescheduleRequest(
        message_id,
        new_due,
        to=to,
        current_due=parse_instant(due, "--due") if due else None,
        scan_limit=scan_limit,
        keep_record=keep_record,
        progress=_scan_progress,
    )
    check_request(opened, request)
    result = opened.reschedule(request)
    due_at = instant(result.due_at)
    if result.record is not None:
        if result.missing:
            route.print(result.as_dict(), f"not moved: {result.record.note}")
            raise fail(f"no message {message_id!r} is waiting in the tier", code=1)
        done = "rescheduled {} to {}" if result.moved else "reschedule of {} to {} accepted"
        route.print(result.as_dict(), f"{done.format(message_id, due_at)} (route: aws): {result.record.note}")
        return
    if not result.moved:
        raise UsageError(f"no pending message {message_id!r} {_GONE[result.route]}")
    route.print(result.as_dict(), f"rescheduled {message_id} to {due_at} (route: {result.route})")


def _scan_progress(p: ScanProgress) -> None:
    say(f"reschedule: read {p.read:,} of {p.listed:,} objects ({p.seconds:.0f} s)…", stderr=True)


_GONE = {
    "store": "(already delivered, cancelled or never stored)",
    "azure": "in the delays table (already delivered or cancelled, sent natively (≤ 7 days without "
    "--cancellable), or another --endpoint)",
}


def register_operator_commands(app: typer.Typer) -> None:
    """Add send, pending, cancel and reschedule to ``app``."""
    app.command()(with_route_options(send))
    app.command()(with_route_options(pending))
    for takes_an_id in (cancel, reschedule):
        app.command(cls=TakesAnId)(with_route_options(takes_an_id))
