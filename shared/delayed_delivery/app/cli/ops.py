"""Operator commands: send, pending, cancel and reschedule on a SQL store (``--store``) or a cloud (``--cloud``).

Routes: ``--store sqlite:///…|postgresql://…`` (exact), ``--cloud azure`` (the endpoint's delays table: exact;
native sends ≤ 7 days are not in it), ``--cloud aws`` (send through the delayed sender; pending from queue
attributes, approximate; cancel and reschedule write a record the requeue function applies at the next hop).
``--local`` points a cloud route at the local emulators (moto server on 127.0.0.1:5000, Azurite on 10000-10002;
``delayed-delivery local up`` starts them there).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from delayed_delivery.app.routes import (  # no cloud SDK at import: the routes import theirs when used
    AzureTableRoute,
    SqsRoute,
)
from delayed_delivery.clock import SystemClock, utc
from delayed_delivery.durations import format_duration, to_seconds
from delayed_delivery.errors import DelayedDeliveryError, InvalidMessageError, TransientError
from delayed_delivery.model import DelayedMessage
from delayed_delivery.ports import DelayedMessageStore, InspectableStore, ReschedulableStore
from delayed_delivery.stores import open_store

__all__ = ["register_operator_commands"]

console = Console()
err = Console(stderr=True)

StoreOption = Annotated[
    str | None,
    typer.Option(
        "--store",
        envvar="DELAYED_DELIVERY_STORE",
        help="Store URL: sqlite:///file.db, sqlite:////abs/file.db or postgresql://… (env DELAYED_DELIVERY_STORE).",
        rich_help_panel="Route",
    ),
]
CloudOption = Annotated[
    str | None,
    typer.Option(
        "--cloud",
        envvar="DELAYED_DELIVERY_CLOUD",
        help="aws (SQS) or azure (Storage Queues + delays table); wins over --store.",
        rich_help_panel="Route",
    ),
]
LocalOption = Annotated[
    bool,
    typer.Option(
        "--local",
        help="Use the local emulators: moto at 127.0.0.1:5000, Azurite at 10000-10002 (`delayed-delivery local up`).",
        rich_help_panel="Route",
    ),
]
EndpointUrlOption = Annotated[
    str | None,
    typer.Option(
        "--endpoint-url",
        envvar="AWS_ENDPOINT_URL_SQS",
        help="aws: SQS endpoint URL (env AWS_ENDPOINT_URL_SQS).",
        rich_help_panel="Route",
    ),
]
RegionOption = Annotated[
    str | None,
    typer.Option("--region", envvar="AWS_DEFAULT_REGION", help="aws: region.", rich_help_panel="Route"),
]
ConnectionOption = Annotated[
    str | None,
    typer.Option(
        "--connection-string",
        envvar="DELAYED_DELIVERY_STORAGE_CONNECTION_STRING",
        help="azure: storage connection string (UseDevelopmentStorage=true for Azurite's standard ports).",
        rich_help_panel="Route",
    ),
]
EndpointOption = Annotated[
    str,
    typer.Option(
        "--endpoint",
        envvar="DELAYED_DELIVERY_ENDPOINT",
        help="azure: the endpoint that owns the delays table (table delays+SHA-1(endpoint)).",
        rich_help_panel="Route",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
DelayOption = Annotated[str | None, typer.Option("--delay", "-d", help="Delay from now, e.g. 90s, 2h, 40d, 1y.")]
AtOption = Annotated[str | None, typer.Option("--at", help="Due time, ISO-8601 with a time zone.")]
ToOption = Annotated[
    str | None,
    typer.Option("--to", help="aws: the destination queue the message was sent to (its -delay.fifo hop cycle)."),
]


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
    return _instant(at, "--at")


def _instant(text: str, option: str) -> datetime:
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidMessageError(f"cannot read {option} {text!r}: use ISO-8601, e.g. 2027-01-31T09:00:00Z") from None
    if parsed.tzinfo is None:
        raise InvalidMessageError(f"{option} {text!r} is naive (no time zone): add one, e.g. Z or +02:00")
    return utc(parsed)


def _aws_target(route: SqsRoute | AzureTableRoute | None, to: str | None, due: str | None = None) -> str | None:
    """``--to`` for the SQS route (required there); ``--to`` / ``--due`` anywhere else is a mistake."""
    if isinstance(route, SqsRoute):
        if not to:
            raise UsageError("on --cloud aws give --to QUEUE: the destination queue the message was sent to")
        return to
    if to is not None or due is not None:
        raise UsageError("--to and --due are for --cloud aws (the SQS hop cycle)")
    return None


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


def _open(url: str | None) -> DelayedMessageStore:
    if not url:
        raise UsageError("give a route: --store URL (SQL) or --cloud aws|azure (add --local for the emulators)")
    return open_store(url)


def _cloud(
    cloud: str | None,
    local: bool,
    endpoint_url: str | None,
    region: str | None,
    connection_string: str | None,
    endpoint: str,
) -> SqsRoute | AzureTableRoute | None:
    """The cloud route when ``--cloud`` is given, else None (the ``--store`` route)."""
    if cloud is None:
        if local:
            raise UsageError("--local needs --cloud aws or --cloud azure")
        return None
    if cloud not in ("aws", "azure"):
        raise UsageError(f"--cloud {cloud!r}: use aws or azure")
    from delayed_delivery.app.routes import CloudOptions, open_cloud_route

    return open_cloud_route(CloudOptions(cloud, local, endpoint_url, region, connection_string, endpoint))


def _inspectable(store: DelayedMessageStore) -> InspectableStore:
    if not isinstance(store, InspectableStore):
        raise UsageError(f"{type(store).__name__} cannot list pending messages")
    return store


def send(
    to: Annotated[str, typer.Option("--to", help="Destination queue.")],
    body: Annotated[str, typer.Option("--body", help="Body text, or @FILE to read bytes from a file.")],
    delay: DelayOption = None,
    at: AtOption = None,
    header: Annotated[list[str] | None, typer.Option("--header", "-H", help="Header key=value (repeatable).")] = None,
    message_id: Annotated[str | None, typer.Option("--id", help="Message id (default: a new UUID).")] = None,
    cancellable: Annotated[
        bool, typer.Option("--cancellable", help="azure: keep it in the delays table even if ≤ 7 days.")
    ] = False,
    store: StoreOption = None,
    cloud: CloudOption = None,
    local: LocalOption = False,
    endpoint_url: EndpointUrlOption = None,
    region: RegionOption = None,
    connection_string: ConnectionOption = None,
    endpoint: EndpointOption = "",
    as_json: JsonOption = False,
) -> None:
    """Send a delayed message; prints its id and the route it took.

    Examples:
      delayed-delivery send --cloud aws --local --to orders --delay 40d --body '{"id": 1}'
      delayed-delivery send --cloud azure --local --endpoint shop --to orders --at 2027-01-31T09:00:00Z --body @o.json
      delayed-delivery send --store sqlite:///delays.db --to orders --delay 2h --body hello -H type=Reminder
    """
    due = _due(delay, at)
    payload, headers = _body(body), _headers(header or [])
    route = _cloud(cloud, local, endpoint_url, region, connection_string, endpoint)
    if route is not None:
        if cancellable and route.name != "azure":
            raise UsageError(
                "--cancellable is for --cloud azure (on SQS, `cancel ID --to QUEUE` works for any long delay)"
            )
        if isinstance(route, AzureTableRoute):
            result = route.send(to, payload, due, headers, message_id, cancellable=cancellable)
        else:
            result = route.send(to, payload, due, headers, message_id)
    else:
        if cancellable:
            raise UsageError("--cancellable is for --cloud azure (store messages can always be cancelled)")
        target = _open(store)
        store_after = getattr(target, "store_after", None)
        if delay is not None and callable(store_after):
            # The store's own clock decides (PostgreSQL: now() + delay), so a skewed sender cannot deliver early.
            message = store_after(delay, to, payload, headers=headers, message_id=message_id)
            due = message.due_at
        else:
            message = DelayedMessage.create(to, payload, at=due, headers=headers, message_id=message_id)
            target.store(message)
        result = {"message_id": message.message_id, "route": "store", "destination": to, "due_at": due.isoformat()}
    if as_json:
        console.print_json(json.dumps(result))
    else:
        console.print(
            f"{result['message_id']}  → {to} at {result['due_at']} (route: {result['route']})", highlight=False
        )


def pending(
    by: Annotated[str, typer.Option("--by", help="Bucket the backlog by hour or day.")] = "day",
    queue: Annotated[str | None, typer.Option("--queue", help="aws: only this endpoint's queues.")] = None,
    store: StoreOption = None,
    cloud: CloudOption = None,
    local: LocalOption = False,
    endpoint_url: EndpointUrlOption = None,
    region: RegionOption = None,
    connection_string: ConnectionOption = None,
    endpoint: EndpointOption = "",
    as_json: JsonOption = False,
) -> None:
    """Show the backlog by due hour or day, the next due time and the oldest overdue message.

    Exact for SQL stores and the Azure delays table; on SQS, approximate counts from queue attributes.

    Examples:
      delayed-delivery pending --store sqlite:///delays.db --by hour
      delayed-delivery pending --cloud azure --local --endpoint shop --json
      delayed-delivery pending --cloud aws --local
    """
    if by not in ("hour", "day"):
        raise UsageError("--by must be hour or day")
    route = _cloud(cloud, local, endpoint_url, region, connection_string, endpoint)
    if isinstance(route, SqsRoute):
        data = route.pending(queue)
        if as_json:
            console.print_json(json.dumps(data))
            return
        table = Table(title=f"SQS pending (approximate): {data['pending']} message(s)")
        for col in ("queue", "in the -delay.fifo hop cycle", "final native delay", "ready at destination"):
            table.add_column(col, justify="left" if col == "queue" else "right")
        for row in data["queues"]:
            table.add_row(
                row["queue"], str(row["hop_cycle"]), str(row["final_native_delay"]), str(row["ready_at_destination"])
            )
        console.print(table)
        _print_error_queue(data)
        console.print(f"[dim]limits: {data['limits']}[/dim]", highlight=False)
        return
    if queue is not None:
        raise UsageError("--queue is for --cloud aws")
    if route is not None:
        data = route.pending(3600 if by == "hour" else 86_400)
    else:
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
    overdue = float(data["oldest_overdue_seconds"])
    claimed = f"   claimed or retrying: {data['claimed_or_retrying']}" if "claimed_or_retrying" in data else ""
    console.print(
        f"pending: {data['pending']}   next due: {data['next_due'] or '-'}   "
        f"oldest overdue: {format_duration(overdue) if overdue else '-'}{claimed}",
        highlight=False,
    )
    backlog = [(datetime.fromisoformat(b["bucket"]), int(b["count"])) for b in data["backlog"]]
    table = Table(title=f"backlog by due {by}")
    table.add_column(by)
    table.add_column("messages", justify="right")
    table.add_column("")
    peak = max((n for _, n in backlog), default=1)
    for bucket, n in backlog[:48]:
        label = bucket.strftime("%Y-%m-%d %H:00" if by == "hour" else "%Y-%m-%d")
        table.add_row(label, str(n), "█" * max(1, round(30 * n / peak)))
    if len(backlog) > 48:
        table.caption = f"… {len(backlog) - 48} more buckets (use --json for all)"
    console.print(table)
    _print_error_queue(data)
    if "limits" in data:
        console.print(f"[dim]limits: {data['limits']}[/dim]", highlight=False)


def _print_error_queue(data: dict[str, Any]) -> None:
    if data.get("error_queue_messages") is not None:
        console.print(
            f"error queue {data['error_queue']!r}: {data['error_queue_messages']} message(s)", highlight=False
        )


def cancel(
    message_id: Annotated[str, typer.Argument(help="The message id to cancel.")],
    to: ToOption = None,
    due: Annotated[
        str | None,
        typer.Option(
            "--due", help="aws: the message's due time (ISO-8601), if known: says for sure if it is too late."
        ),
    ] = None,
    store: StoreOption = None,
    cloud: CloudOption = None,
    local: LocalOption = False,
    endpoint_url: EndpointUrlOption = None,
    region: RegionOption = None,
    connection_string: ConnectionOption = None,
    endpoint: EndpointOption = "",
    as_json: JsonOption = False,
) -> None:
    """Cancel a delayed message that has not been delivered yet (SQL stores and the Azure table: exact).

    On SQS a record is written and the message is dropped at its next hop, unless it already waits out its
    final native delay (due within 15 minutes).

    Examples:
      delayed-delivery cancel 3f2c… --store sqlite:///delays.db
      delayed-delivery cancel 3f2c… --cloud azure --local --endpoint shop
      delayed-delivery cancel 3f2c… --cloud aws --local --to orders [--due 2027-01-31T09:00:00Z]
    """
    route = _cloud(cloud, local, endpoint_url, region, connection_string, endpoint)
    queue = _aws_target(route, to, due)
    if isinstance(route, SqsRoute):
        assert queue is not None
        data = route.cancel(message_id, to=queue, due=_instant(due, "--due") if due is not None else None)
        if as_json:
            console.print_json(json.dumps(data))
        else:
            console.print(f"cancel of {message_id} accepted (route: aws): {data['note']}", highlight=False)
        return
    removed = route.cancel(message_id) if route is not None else _open(store).remove(message_id)
    if not removed:
        raise UsageError(f"no pending message {message_id!r} {_GONE[route.name if route else 'store']}")
    name = route.name if route else "store"
    if as_json:
        console.print_json(json.dumps({"message_id": message_id, "cancelled": True, "route": name}))
    else:
        console.print(f"cancelled {message_id} (route: {name})", highlight=False)


def reschedule(
    message_id: Annotated[str, typer.Argument(help="The message id to move.")],
    delay: DelayOption = None,
    at: AtOption = None,
    to: ToOption = None,
    store: StoreOption = None,
    cloud: CloudOption = None,
    local: LocalOption = False,
    endpoint_url: EndpointUrlOption = None,
    region: RegionOption = None,
    connection_string: ConnectionOption = None,
    endpoint: EndpointOption = "",
    as_json: JsonOption = False,
) -> None:
    """Move a pending message to a new due time (SQL stores and the Azure table: exact).

    On SQS a record is written and the message moves at its next hop, unless it already waits out its final
    native delay (due within 15 minutes).

    Examples:
      delayed-delivery reschedule 3f2c… --delay 3d --store sqlite:///delays.db
      delayed-delivery reschedule 3f2c… --at 2027-06-01T08:00:00Z --cloud azure --local --endpoint shop
      delayed-delivery reschedule 3f2c… --delay 2h --cloud aws --local --to orders
    """
    due = _due(delay, at)
    route = _cloud(cloud, local, endpoint_url, region, connection_string, endpoint)
    queue = _aws_target(route, to)
    if isinstance(route, SqsRoute):
        assert queue is not None
        data = route.reschedule(message_id, due, to=queue)
        if as_json:
            console.print_json(json.dumps(data))
        else:
            console.print(f"reschedule of {message_id} to {data['due_at']} accepted (route: aws): {data['note']}")
        return
    if route is not None:
        moved = route.reschedule(message_id, due)
    else:
        s = _open(store)
        if not isinstance(s, ReschedulableStore):
            raise UsageError(f"{type(s).__name__} cannot reschedule")
        moved = s.reschedule(message_id, due)
    if not moved:
        raise UsageError(f"no pending message {message_id!r} {_GONE[route.name if route else 'store']}")
    name = route.name if route else "store"
    if as_json:
        console.print_json(json.dumps({"message_id": message_id, "due_at": due.isoformat(), "route": name}))
    else:
        console.print(f"rescheduled {message_id} to {due.isoformat()} (route: {name})", highlight=False)


_GONE = {
    "store": "(already delivered, cancelled or never stored)",
    "azure": "in the delays table (already delivered or cancelled, sent natively (≤ 7 days without "
    "--cancellable), or another --endpoint)",
}


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
            hint = ""
            if kwargs.get("local") and isinstance(exc, TransientError):
                hint = " (are the emulators up? start them with `delayed-delivery local up`)"
            raise _fail(" ".join(f"{exc}{hint}".split())) from None  # one line, even for multi-line driver errors

    return wrapper
