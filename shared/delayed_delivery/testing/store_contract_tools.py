"""What the store contract suites share: their messages, the claim a fetch attached, the wall clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ..errors import MessageInFlightError
from ..model import DelayedMessage
from ..ports import DelayedMessageStore, ReschedulableStore, claim_of

__all__ = ["T0", "fetched_claim", "msg", "operator_sees_in_flight", "secs", "wall_now"]

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def msg(i: int | str, due: datetime, **kw: Any) -> DelayedMessage:
    """Message ``m-{i}`` to ``orders`` (unless given), due at ``due``."""
    return DelayedMessage(
        message_id=f"m-{i}",
        destination=kw.pop("destination", "orders"),
        body=kw.pop("body", f"body {i}".encode()),
        due_at=due,
        **kw,
    )


def secs(seconds: float) -> timedelta:
    """``seconds`` as a timedelta."""
    return timedelta(seconds=seconds)


def fetched_claim(message: DelayedMessage | None) -> str:
    """The claim token a fetch attached; every store of this package attaches one."""
    assert message is not None, "nothing was fetched"
    claim = claim_of(message)
    assert claim, f"{message.message_id!r} was fetched without a claim token"
    return claim


def operator_sees_in_flight(store: DelayedMessageStore, message_id: str) -> None:
    """An operator's cancel and reschedule of ``message_id`` are both refused as in flight."""
    with pytest.raises(MessageInFlightError, match=message_id):
        store.remove(message_id)
    if isinstance(store, ReschedulableStore):
        with pytest.raises(MessageInFlightError, match=message_id):
            store.reschedule(message_id, wall_now() + secs(3600))


def wall_now() -> datetime:
    """Wall-clock now, whole milliseconds (operators' in-flight checks compare claims with the real clock)."""
    now = datetime.now(UTC)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)
