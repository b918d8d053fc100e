"""One message per id in a migration batch: a legacy export may repeat an id."""

from __future__ import annotations

from collections.abc import Sequence

from ..model import DelayedMessage

__all__ = ["one_per_id"]


def one_per_id(messages: Sequence[DelayedMessage]) -> tuple[list[DelayedMessage], list[tuple[str, str]]]:
    """The batch with one message per id (the latest due time kept) and a refusal for each other copy."""
    kept: dict[str, DelayedMessage] = {}
    refused: list[tuple[str, str]] = []
    for m in messages:
        other = kept.get(m.message_id)
        if other is None:
            kept[m.message_id] = m
            continue
        later, earlier = (m, other) if m.due_at >= other.due_at else (other, m)
        kept[m.message_id] = later
        refused.append(
            (earlier.message_id, f"id repeated in the export: the copy due {later.due_at.isoformat()} was kept")
        )
    return list(kept.values()), refused
