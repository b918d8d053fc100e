"""Daylight saving: how a local wall-clock slot becomes instants, by a named policy (``gap/fold``).

A slot that exists once is one instant. A slot in a **gap** (it does not exist) is skipped, shifted (read with the
UTC offset in force before the gap: RFC 5545, Python ``fold=0``) or clamped (to the transition instant, Vixie's
"run immediately"). A slot in a **fold** (it happens twice) fires at the first pass, both, or the last. ``auto``
resolves per expression: ``skip/both`` when the hour field covers all 24 hours (a cadence), else ``shift/first``;
presets give familiar systems' rules (``recurring-semantics.md`` §2; docs/schedules.md has the table).
Every decision comes with a note ("02:30 does not exist on 2027-03-14: shifted to 03:30").
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from enum import StrEnum

from ..errors import InvalidScheduleError

__all__ = ["AUTO", "PRESETS", "DstPolicy", "DstRule", "Fold", "Gap", "Placed", "parse_dst", "place"]


class Gap(StrEnum):
    """What a slot that does not exist (spring forward) does."""

    SKIP = "skip"
    SHIFT = "shift"
    CLAMP = "clamp"


class Fold(StrEnum):
    """Which pass of a slot that happens twice (fall back) fires."""

    FIRST = "first"
    BOTH = "both"
    LAST = "last"


@dataclass(frozen=True, slots=True)
class DstPolicy:
    """One gap rule and one fold rule, written ``gap/fold``."""

    gap: Gap
    fold: Fold

    def __str__(self) -> str:
        return f"{self.gap}/{self.fold}"


#: The policy named times of day get under ``auto`` (RFC 5545, JS Temporal ``compatible``, Python ``fold=0``).
NAMED_TIMES = DstPolicy(Gap.SHIFT, Fold.FIRST)
#: The policy cadences get under ``auto`` (wall-clock matching: every real hour fires once for whole-hour shifts).
CADENCE = DstPolicy(Gap.SKIP, Fold.BOTH)
AUTO = "auto"
#: Presets matching familiar systems; ``vixie`` (= cronsim 2.8, Debian cron) depends on the expression.
PRESETS = {
    "eventbridge": DstPolicy(Gap.SKIP, Fold.FIRST),
    "temporal": DstPolicy(Gap.SKIP, Fold.BOTH),
    "kubernetes": DstPolicy(Gap.SKIP, Fold.BOTH),
    "vixie": DstPolicy(Gap.CLAMP, Fold.FIRST),
}


@dataclass(frozen=True, slots=True)
class DstRule:
    """What the user chose (``auto``, a preset or ``gap/fold``); ``resolve`` gives the policy for an expression."""

    name: str

    def resolve(self, *, every_hour: bool, minute_or_hour_starred: bool, cron: bool = True) -> DstPolicy:
        """The policy for an expression: ``every_hour`` (hour field covers 24 hours), ``minute_or_hour_starred``
        (the minute or hour field begins with ``*``: Vixie's "normal" jobs); ``cron`` False for ``at(...)``."""
        if self.name == AUTO:
            return CADENCE if cron and every_hour else NAMED_TIMES
        if self.name == "vixie":
            return CADENCE if cron and minute_or_hour_starred else PRESETS["vixie"]
        preset = PRESETS.get(self.name)
        if preset is not None:
            return preset
        gap, _, fold = self.name.partition("/")
        return DstPolicy(Gap(gap), Fold(fold))

    def __str__(self) -> str:
        return self.name


def parse_dst(text: str) -> DstRule:
    """``auto``, a preset name or ``GAP/FOLD`` (e.g. ``shift/first``); anything else is refused in one line."""
    name = text.strip().lower() if isinstance(text, str) else ""
    if name == AUTO or name in PRESETS:
        return DstRule(name)
    gap, slash, fold = name.partition("/")
    if slash and gap in Gap.__members__.values() and fold in Fold.__members__.values():
        return DstRule(f"{gap}/{fold}")
    raise InvalidScheduleError(
        f"DST policy {str(text)[:40]!r}: use auto, a preset ({', '.join(PRESETS)}) or GAP/FOLD with GAP skip, shift "
        "or clamp and FOLD first, both or last (e.g. shift/first)"
    )


@dataclass(frozen=True, slots=True)
class Placed:
    """An instant a slot fires at (None: skipped), with the note saying what daylight saving did, if anything."""

    instant: datetime | None
    note: str | None = None
    #: The instant a skipped slot stands at (where its note attaches to the next fire).
    at: datetime | None = None


def wall(instant: datetime, zone: tzinfo) -> datetime:
    """The naive local wall-clock time of ``instant`` in ``zone``."""
    return instant.astimezone(zone).replace(tzinfo=None)


def clock(value: datetime) -> str:
    """``HH:MM``, or ``HH:MM:SS`` when the seconds are not zero."""
    return value.strftime("%H:%M:%S" if value.second else "%H:%M")


def place(slot: datetime, zone: tzinfo, policy: DstPolicy) -> list[Placed]:
    """The instants (UTC) the naive local ``slot`` maps to under ``policy``: 0, 1 or 2, with notes."""
    first_offset = slot.replace(tzinfo=zone, fold=0).utcoffset()
    second_offset = slot.replace(tzinfo=zone, fold=1).utcoffset()
    assert first_offset is not None and second_offset is not None
    a = (slot - first_offset).replace(tzinfo=UTC)
    if first_offset == second_offset:
        return [Placed(a)]
    b = (slot - second_offset).replace(tzinfo=UTC)
    valid = [t for t in (a, b) if wall(t, zone) == slot]
    if len(valid) == 2:
        return _fold(slot, zone, min(valid), max(valid), policy.fold)
    if len(valid) == 1:
        return [Placed(valid[0])]
    return [_gap(slot, zone, shifted=a, before=b, gap=policy.gap)]


def _fold(slot: datetime, zone: tzinfo, first: datetime, second: datetime, rule: Fold) -> list[Placed]:
    what = f"{clock(slot)} happens twice on {slot.date().isoformat()}"
    names = (first.astimezone(zone).tzname(), second.astimezone(zone).tzname())
    if rule is Fold.FIRST:
        return [Placed(first, f"{what}: fired at the first ({names[0]}), not the second")]
    if rule is Fold.LAST:
        return [Placed(second, f"{what}: fired at the second ({names[1]}), not the first")]
    return [Placed(first, f"{what}: the first of two ({names[0]})"), Placed(second, f"{what}: the second ({names[1]})")]


def _gap(slot: datetime, zone: tzinfo, *, shifted: datetime, before: datetime, gap: Gap) -> Placed:
    """A slot in a gap: ``shifted`` is it read with the offset before the gap, ``before`` with the one after."""
    what = f"{clock(slot)} does not exist on {slot.date().isoformat()}"
    transition = _transition(zone, before, shifted)
    if gap is Gap.SKIP:
        return Placed(None, f"{what}: skipped", at=transition)
    target = shifted if gap is Gap.SHIFT else transition
    local = wall(target, zone)
    day = "" if local.date() == slot.date() else f" on {local.date().isoformat()}"
    verb = "shifted" if gap is Gap.SHIFT else "clamped"
    return Placed(target, f"{what}: {verb} to {clock(local)}{day}")


def _transition(zone: tzinfo, low: datetime, high: datetime) -> datetime:
    """The first second in ``(low, high]`` whose wall clock is past the gap (the offset changed at it)."""
    after = high.astimezone(zone).utcoffset()
    lo, hi = 0, int((high - low).total_seconds())  # invariant: low + lo is before, low + hi is after
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if (low + timedelta(seconds=mid)).astimezone(zone).utcoffset() == after:
            hi = mid
        else:
            lo = mid
    return low + timedelta(seconds=hi)
