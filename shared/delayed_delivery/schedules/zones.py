"""Time zones for schedules: IANA names, read from the ``tzdata`` wheel when it is installed, else from the system.

The wheel comes first (it is a runtime dependency and ships in every deploy asset), so a Lambda, a function app and
a laptop evaluate a schedule against one IANA release; ``tz_database()`` says which release and from where. Names
are ``Area/Location`` (``Europe/Berlin``), ``Etc/…`` or ``UTC``; abbreviations such as ``EST`` or ``CET`` are
refused, since they name an offset or a rule that differs from what people mean by them.
"""

from __future__ import annotations

import re
import threading
import zoneinfo
from dataclasses import dataclass
from datetime import tzinfo
from importlib import resources
from pathlib import Path

from ..errors import InvalidScheduleError

__all__ = ["TzDatabase", "load_zone", "tz_database"]

_NAME = re.compile(r"^(?:UTC|(?:Etc|[A-Z][A-Za-z]+)/[A-Za-z0-9_+-]+(?:/[A-Za-z0-9_+-]+)?)$")
_lock = threading.Lock()
_zones: dict[str, tzinfo] = {}


@dataclass(frozen=True, slots=True)
class TzDatabase:
    """Which IANA time-zone release schedules use, and where it comes from."""

    version: str
    source: str

    def describe(self) -> str:
        """E.g. ``IANA 2026f (tzdata wheel)``."""
        return f"IANA {self.version} ({self.source})"


def load_zone(name: str) -> tzinfo:
    """The zone called ``name``; ``InvalidScheduleError`` for an unknown name or an abbreviation."""
    if not isinstance(name, str) or len(name) > 64 or _NAME.match(name) is None or ".." in name:
        raise InvalidScheduleError(
            f"unknown time zone {str(name)[:64]!r}: use an IANA name such as Europe/Berlin, America/New_York or UTC "
            "(abbreviations such as EST or CET are not zones)"
        )
    with _lock:
        zone = _zones.get(name)
    if zone is not None:
        return zone
    zone = _from_wheel(name)
    if zone is None:
        try:
            zone = zoneinfo.ZoneInfo(name)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
            raise InvalidScheduleError(
                f"unknown time zone {name!r} (time zones: {tz_database().describe()}): use an IANA name such as "
                "Europe/Berlin"
            ) from None
    with _lock:
        return _zones.setdefault(name, zone)


def _from_wheel(name: str) -> tzinfo | None:
    """The zone from the ``tzdata`` wheel, or None when the wheel is not installed or has no such zone."""
    try:
        entry = resources.files("tzdata").joinpath("zoneinfo", *name.split("/"))
        if not entry.is_file():
            return None
        with entry.open("rb") as f:
            return zoneinfo.ZoneInfo.from_file(f, key=name)
    except (ModuleNotFoundError, OSError, ValueError):
        return None


def tz_database() -> TzDatabase:
    """The IANA release schedules use: the ``tzdata`` wheel's, else the system's (``version`` unknown if unreadable)."""
    try:
        entry = resources.files("tzdata").joinpath("zoneinfo", "tzdata.zi")
        if entry.is_file():
            return TzDatabase(_version(entry.read_text(encoding="utf-8")[:200]), "tzdata wheel")
    except (ModuleNotFoundError, OSError, UnicodeDecodeError):
        pass
    for folder in zoneinfo.TZPATH:
        path = Path(folder) / "tzdata.zi"
        try:
            with path.open(encoding="utf-8") as f:
                return TzDatabase(_version(f.read(200)), f"system, {folder}")
        except (OSError, UnicodeDecodeError):
            continue
    return TzDatabase("unknown", "system")


def _version(head: str) -> str:
    """The release named by ``tzdata.zi``'s first line, ``# version 2026f``."""
    match = re.match(r"#\s*version\s+(\S+)", head)
    return match.group(1) if match else "unknown"
