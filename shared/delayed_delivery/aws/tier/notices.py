"""The error-queue notice for a bucket object the timer cannot read whole: one per object, however many bad lines.

A crafted 65 KB object (a valid header, then 9,999 empty lines) once gave 9,999 notices. Now the object is copied
under ``problems/`` (every raw line is kept there) and one notice summarises it: what is wrong with the object as a
whole, how many lines cannot be read, the first few of them (raw, cut), the ids named on bad lines, and the reasons
with their counts. ``BadLines`` gathers that summary line by line in bounded memory (a streamed object's bad lines
are never all held). Pure: the timer sends what ``object_notice`` returns. The format is in docs/buckets.md.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ...timebuckets.format import PoisonEntry
from .timer_sqs import Notice

__all__ = ["NOTICE_FORMAT", "NOTICE_IDS", "NOTICE_LINES", "NOTICE_REASONS", "BadLines", "object_notice"]

NOTICE_FORMAT = "delayed-delivery-bucket-object/2"
#: Bad lines shown whole (their raw text, cut to ``MAX_POISON_RAW_BYTES`` each); the rest are counted.
NOTICE_LINES = 5
#: Message ids named on bad lines that a notice lists (the copy under ``problems/`` holds every line).
NOTICE_IDS = 100
#: Distinct reasons listed with their counts (the first ones met; later new reasons are only counted).
NOTICE_REASONS = 10
_REASON_CHARS = 300


def _json(document: Mapping[str, object]) -> str:
    return json.dumps(document, ensure_ascii=True, separators=(",", ":"))


@dataclass(slots=True)
class BadLines:
    """The unreadable lines of one object, summed up as they are met: memory bounded whatever the object holds."""

    count: int = 0
    first: list[PoisonEntry] = field(default_factory=list)
    ids: dict[str, None] = field(default_factory=dict)
    more_ids: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    #: Lines whose reason was not among the first ``NOTICE_REASONS`` distinct ones.
    other_reasons: int = 0

    @classmethod
    def of(cls, entries: Iterable[PoisonEntry]) -> BadLines:
        """The summary of ``entries``."""
        bad = cls()
        for entry in entries:
            bad.add(entry)
        return bad

    def add(self, entry: PoisonEntry) -> None:
        """Count one bad line."""
        self.count += 1
        if len(self.first) < NOTICE_LINES:
            self.first.append(entry)
        if entry.message_id is not None and entry.message_id not in self.ids:
            if len(self.ids) < NOTICE_IDS:
                self.ids[entry.message_id] = None
            else:
                self.more_ids += 1
        reason = entry.reason[:_REASON_CHARS]
        if reason in self.reasons or len(self.reasons) < NOTICE_REASONS:
            self.reasons[reason] = self.reasons.get(reason, 0) + 1
        else:
            self.other_reasons += 1


def _line(entry: PoisonEntry) -> dict[str, object]:
    """One bad line: its number, id, reason and raw text (ASCII-escaped; bytes not UTF-8 as ``\\udcXX``)."""
    return {
        "line": entry.line,
        "id": entry.message_id,
        "reason": entry.reason[:_REASON_CHARS],
        "raw": entry.raw.decode("utf-8", "surrogateescape"),
        "raw_bytes": entry.raw_size,
        "truncated": entry.raw_size > len(entry.raw),
    }


def _reason(key: str, copy: str, problem: str | None, bad: BadLines) -> str:
    """The ``FailureReason`` line: what is wrong, the first bad line, where the copy is."""
    parts = []
    if problem is not None:
        parts.append(f"bucket object {key} is damaged: {problem}")
    if bad.first:
        first = bad.first[0]
        what = f"{bad.count:,} line(s)" + ("" if parts else f" of {key}")
        parts.append(f"{what} cannot be read (first: line {first.line}: {first.reason[:200]})")
    return "; ".join(parts) + f"; a copy is kept at {copy}"


def object_notice(key: str, copy: str, problem: str | None, bad: BadLines) -> Notice:
    """The one notice for the object at ``key`` (copied to ``copy``): bounded whatever the object holds.

    The reduced form (sent when the error queue refuses the whole notice) leaves out the raw lines.
    """
    common = sorted(bad.reasons.items(), key=lambda item: -item[1])
    reduced: dict[str, object] = {
        "format": NOTICE_FORMAT,
        "object": key,
        "copy": copy,
        "problem": problem,
        "bad_lines": bad.count,
        "ids": list(bad.ids),
        "more_ids": bad.more_ids,
        "reasons": [{"reason": reason, "lines": lines} for reason, lines in common],
        "more_reasons": bad.other_reasons,
    }
    whole = {**reduced, "lines": [_line(entry) for entry in bad.first]}
    return Notice(_json(whole), _reason(key, copy, problem, bad), key=key, reduced=_json(reduced))
