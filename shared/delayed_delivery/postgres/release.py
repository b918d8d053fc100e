"""Release control for the PostgreSQL batch mover: each destination's schedule in a table every mover shares.

The table ``<delays table>_release`` holds one row per capped destination: ``next_free``, the destination's next
free release slot. A mover plans a batch inside its own transaction: it locks the batch's destinations' rows (in
name order, so two movers never deadlock), books a slot per message with the core planner (``release.py``) and
writes ``next_free`` back before it commits. Any number of movers therefore share one cap per destination, with
no leader: a second mover planning the same destination waits for the first one's commit and continues from there.
A message whose slot is later than now is deferred in the delays table (``available_at`` = its slot, due time
kept) and moved, without planning it again, once the slot has come.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg import sql

from ..release import ReleasePlanner, ReleaseRates
from .connection import derived_name
from .store import PostgresDelayedMessageStore

__all__ = ["SharedReleaseSchedule"]

#: ``next_free`` of a destination with no schedule yet: long ago (every slot is free).
_NEVER = datetime(1970, 1, 1, tzinfo=UTC)


class SharedReleaseSchedule:
    """The per-destination release schedule of the movers of one delays table (module docstring)."""

    def __init__(self, store: PostgresDelayedMessageStore, rates: ReleaseRates) -> None:
        self.rates = rates
        self.table = derived_name(store.table, "_release")
        self._t = sql.Identifier(store.schema, self.table)
        self._qualified = f'"{store.schema}"."{self.table}"'
        self._store = store

    def setup(self) -> None:
        """Create the schedule table if missing (safe to run concurrently)."""
        with self._store.cursor() as cur:
            cur.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {t} (destination text PRIMARY KEY, next_free timestamptz NOT NULL)"
                ).format(t=self._t)
            )

    def plan(
        self, cur: psycopg.Cursor[Any], fresh: Sequence[tuple[str, str, datetime]], now: datetime
    ) -> dict[str, datetime]:
        """Slots for ``fresh`` ``(message id, destination, due)`` rows (due order) of capped destinations.

        Runs in the caller's transaction: the destinations' schedule rows stay locked until it commits.
        """
        capped = sorted({d for _, d, _ in fresh if self.rates.rate_for(d) is not None})
        if not capped:
            return {}
        cur.execute(
            sql.SQL(
                "INSERT INTO {t} (destination, next_free) SELECT unnest(%(d)s::text[]), %(never)s"
                " ON CONFLICT (destination) DO NOTHING"
            ).format(t=self._t),
            {"d": capped, "never": _NEVER},
        )
        cur.execute(
            sql.SQL(
                "SELECT destination, next_free FROM {t} WHERE destination = ANY(%(d)s) ORDER BY destination FOR UPDATE"
            ).format(t=self._t),
            {"d": capped},
        )
        state = {str(d): when.timestamp() for d, when in cur.fetchall()}
        planner = ReleasePlanner(self.rates, state=state)
        n = now.timestamp()
        slots = {
            mid: datetime.fromtimestamp(planner.slot_epoch(d, due.timestamp(), n), UTC)
            for mid, d, due in sorted(fresh, key=lambda r: r[2])
            if d in state
        }
        booked = planner.state()
        cur.execute(
            sql.SQL(
                "UPDATE {t} AS s SET next_free = c.next_free"
                " FROM unnest(%(d)s::text[], %(n)s::timestamptz[]) AS c(destination, next_free)"
                " WHERE s.destination = c.destination"
            ).format(t=self._t),
            {"d": list(booked), "n": [datetime.fromtimestamp(v, UTC) for v in booked.values()]},
        )
        return slots

    def reserve(self, destination: str, dues: Sequence[float], now: float) -> list[float | None]:
        """``ports.ReleaseSchedule``: ``plan`` for one destination in a transaction of its own (epoch seconds)."""
        fresh = [(str(i), destination, datetime.fromtimestamp(due, UTC)) for i, due in enumerate(dues)]
        with self._store.cursor(transaction=True) as cur:
            slots = self.plan(cur, fresh, datetime.fromtimestamp(now, UTC))
        return [slots[str(i)].timestamp() if str(i) in slots else due for i, due in enumerate(dues)]

    def lags(self, now: datetime) -> dict[str, float]:
        """Seconds until each destination's next free slot (its current release lag), for operators."""
        with self._store.cursor() as cur:
            cur.execute("SELECT to_regclass(%s)", (self._qualified,))
            found = cur.fetchone()
            if found is None or found[0] is None:
                return {}
            cur.execute(sql.SQL("SELECT destination, next_free FROM {t}").format(t=self._t))
            rows = cur.fetchall()
        return {str(d): max(0.0, (when - now).total_seconds()) for d, when in rows}
