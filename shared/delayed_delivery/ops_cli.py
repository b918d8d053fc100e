"""Operator commands: send, pending, cancel and reschedule against a delayed-message store."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from .clock import SystemClock, utc
from .durations import format_duration, to_seconds
from .errors import DelayedDeliveryError, InvalidMessageError
from .model import DelayedMessage
from .ports import DelayedMessageStore, InspectableStore, ReschedulableStore
from .stores import open_store

__all__ = ["register_operator_commands"]

console = Console()
err = Console(stderr=True)

StoreOption = Annotated[
    str,
    typer.Option(
        "--store",
        envvar="DELAYED_DELIVERY_STORE",
        help="Store URL: sqlite:///file.db, sqlite:////abs/file.db or postgresql://… (env DELAYED_DELIVERY_STORE).",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
DelayOption = Annotated[str | None, typer.Option("--delay", "-d", help="Delay from now, e.g. 90s, 2h, 40d, 1y.")]
AtOption = Annotated[str | None, typer.Option("--at", help="Due time, ISO-8601 with a time zone.")]


class UsageError(DelayedDeliveryError):
    """A command-line mistake."""


def _fail(message: str) -> typer.Exit:
    err.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code=2)


def _due(delay: str | None, at: str | None) -> datetime:
    if (delay is None) == (at is None):
        raise UsageError("give exactly one of --delay or --at")
    if delay is not None:
        return SystemClock().now() + timedelta(seconds=to_seconds(delay))
    assert at is not None
    try:
        parsed = datetime.fromisoformat(at.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidMessageError(f"cannot read --at {at!r}: use ISO-8601, e.g. 2027-01-31T09:00:00Z") from None
    return utc(parsed)


def _body(body: str) -> bytes:
    if body.startswith("@"):
        path = Path(body[1:])
        try:
            return path.read_bytes()
        except OSError as exc:
            raise UsageError(f"cannot read body file {str(path)!r}: {exc.strerror or exc}") from None
    return body.encode()


def _headers(pairs: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--header {pair!r} is not key=value")
        out[key] = value
    return out


def _open(url: str) -> DelayedMessageStore:
    return open_store(url)


def _inspectable(store: DelayedMessageStore) -> InspectableStore:
    if not isinstance(store, InspectableStore):
        raise UsageError(f"{type(store).__name__} cannot list pending messages")
    return store


def send(
    to: Annotated[str, typer.Option("--to", help="Destination queue.")],
    body: Annotated[str, typer.Option("--body", help="Body text, or @FILE to read bytes from a file.")],
    store: StoreOption,
    delay: DelayOption = None,
    at: AtOption = None,
    header: Annotated[list[str] | None, typer.Option("--header", "-H", help="Header key=value (repeatable).")] = None,
    message_id: Annotated[str | None, typer.Option("--id", help="Message id (default: a new UUID).")] = None,
    as_json: JsonOption = False,
) -> None:
    """Store a delayed message.

    Example: delayed-delivery send --store sqlite:///delays.db --to orders --delay 40d --body '{"id": 1}'
    """
    due = _due(delay, at)
    target = _open(store)
    store_after = getattr(target, "store_after", None)
    if delay is not None and callable(store_after):
        # The store's own clock decides (PostgreSQL: now() + delay), so a skewed sender cannot deliver early.
        message = store_after(delay, to, _body(body), headers=_headers(header or []), message_id=message_id)
        due = message.due_at
    else:
        message = DelayedMessage.create(to, _body(body), at=due, headers=_headers(header or []), message_id=message_id)
        target.store(message)
    result = {"message_id": message.message_id, "route": "store", "destination": to, "due_at": due.isoformat()}
    if as_json:
        console.print_json(json.dumps(result))
    else:
        console.print(f"{message.message_id}  → {to} at {due.isoformat()} (route: store)", highlight=False)


def pending(
    store: StoreOption,
    by: Annotated[str, typer.Option("--by", help="Bucket the backlog by hour or day.")] = "day",
    as_json: JsonOption = False,
) -> None:
    """Show the backlog by due hour or day, the next due time and the oldest overdue message."""
    if by not in ("hour", "day"):
        raise UsageError("--by must be hour or day")
    s = _inspectable(_open(store))
    now = SystemClock().now()
    earliest = s.earliest_due()
    buckets = s.backlog(3600 if by == "hour" else 86_400)
    overdue = (now - earliest).total_seconds() if earliest is not None and earliest <= now else 0.0
    data = {
        "pending": len(s),
        "next_due": earliest.isoformat() if earliest else None,
        "oldest_overdue_seconds": overdue,
        "backlog": [{"bucket": b.isoformat(), "count": n} for b, n in buckets],
    }
    if as_json:
        console.print_json(json.dumps(data))
        return
    console.print(
        f"pending: {data['pending']}   next due: {data['next_due'] or '-'}   "
        f"oldest overdue: {format_duration(overdue) if overdue else '-'}",
        highlight=False,
    )
    table = Table(title=f"backlog by due {by}")
    table.add_column(by)
    table.add_column("messages", justify="right")
    table.add_column("")
    peak = max((n for _, n in buckets), default=1)
    for bucket, n in buckets[:48]:
        label = bucket.strftime("%Y-%m-%d %H:00" if by == "hour" else "%Y-%m-%d")
        table.add_row(label, str(n), "█" * max(1, round(30 * n / peak)))
    if len(buckets) > 48:
        table.caption = f"… {len(buckets) - 48} more buckets (use --json for all)"
    console.print(table)


def cancel(
    message_id: Annotated[str, typer.Argument(help="The message id to cancel.")],
    store: StoreOption,
    as_json: JsonOption = False,
) -> None:
    """Cancel a delayed message that has not been delivered yet."""
    removed = _open(store).remove(message_id)
    if not removed:
        raise UsageError(f"no pending message {message_id!r} (already delivered, cancelled or never stored)")
    if as_json:
        console.print_json(json.dumps({"message_id": message_id, "cancelled": True}))
    else:
        console.print(f"cancelled {message_id}", highlight=False)


def reschedule(
    message_id: Annotated[str, typer.Argument(help="The message id to move.")],
    store: StoreOption,
    delay: DelayOption = None,
    at: AtOption = None,
    as_json: JsonOption = False,
) -> None:
    """Move a pending message to a new due time."""
    due = _due(delay, at)
    s = _open(store)
    if not isinstance(s, ReschedulableStore):
        raise UsageError(f"{type(s).__name__} cannot reschedule")
    if not s.reschedule(message_id, due):
        raise UsageError(f"no pending message {message_id!r} (already delivered, cancelled or never stored)")
    if as_json:
        console.print_json(json.dumps({"message_id": message_id, "due_at": due.isoformat()}))
    else:
        console.print(f"rescheduled {message_id} to {due.isoformat()}", highlight=False)


def register_operator_commands(app: typer.Typer) -> None:
    """Add send, pending, cancel and reschedule to ``app``."""
    for command in (send, pending, cancel, reschedule):
        app.command()(_friendly(command))


def _friendly(command: Callable[..., None]) -> Callable[..., None]:
    """Turn library errors into one line on stderr and exit code 2."""

    @functools.wraps(command)
    def wrapper(*args: object, **kwargs: object) -> None:
        try:
            command(*args, **kwargs)
        except DelayedDeliveryError as exc:
            raise _fail(str(exc)) from None

    return wrapper
