"""The schedule options the preview and the route commands share: time zone, DST policy, day matching, windows."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import typer

from delayed_delivery.durations import to_seconds
from delayed_delivery.errors import InvalidScheduleError

__all__ = ["DayMatchOption", "Dst", "Zone", "local_text", "window_seconds"]


Zone = Annotated[str, typer.Option("--tz", help="IANA time zone, e.g. Europe/Berlin (default UTC).")]


Dst = Annotated[
    str,
    typer.Option(
        "--dst",
        help="DST policy: auto (default), GAP/FOLD (gap skip|shift|clamp, fold first|both|last, e.g. shift/first) "
        "or a preset: eventbridge, temporal, kubernetes, vixie.",
    ),
]


DayMatchOption = Annotated[
    str, typer.Option("--day-match", help="or (Vixie, default): either day field matches when both are set; and.")
]


def local_text(moment: datetime) -> str:
    """Local time with its offset, e.g. ``2027-03-14T03:30:00-04:00``."""
    return moment.isoformat(timespec="seconds")


def window_seconds(text: str) -> int:
    """``--window``: whole seconds, or a duration such as ``24h`` or ``1d 12h``."""
    seconds = int(text) if text.strip().isdigit() else to_seconds(text)
    if seconds != int(seconds):
        raise InvalidScheduleError(f"--window {text!r} is not a whole number of seconds")
    return int(seconds)
