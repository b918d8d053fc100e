"""Release pacing for the core dispatcher: each fetched message leaves at its release slot (``release.py``).

Without any cap the pacer releases every fetched message at once, in fetch order (the dispatcher's one loop runs
through it either way). With caps, for every fetched message the pacer books a slot (a capped destination's next one
at its rate; an uncapped destination's message: its due time) and decides how the message waits for it:

* the slot has come: it is sent now;
* the transport can hide what it sends (``PlacingTransport``: SQS ``DelaySeconds``, Azure's visibility timeout):
  it is sent, with a whole-second delay, at the moment its slot is a whole number of seconds away, which is
  within a second, so it becomes visible at its slot and the dispatcher holds it for under a second;
* the slot is within ``hold_seconds``: it is held (claimed, in memory) and sent at the slot;
* otherwise the store keeps it (``DeferringStore.defer``: the row keeps its due time and becomes fetchable at
  the slot); when it comes back the store names its slot and it is sent then, not planned again.

What is held is bounded (``max_held`` messages, ``max_held_bytes`` of bodies): when full the dispatcher stops
fetching until sends free room. Nothing held outlives a run: at its end a held message is placed with its delay
rounded up (a placing transport), deferred to its slot (a deferring store), or, with neither, left to its claim,
which expires. A crash loses nothing: every held or deferred message is still a row of the store.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from . import logfields as lf
from .model import DelayedMessage
from .ports import DeferringStore, PlacingTransport, ReleaseStateStore, SharedReleaseState, Transport, slot_of
from .release import ReleasePlanner

__all__ = ["HOLD_SECONDS", "MAX_HELD", "MAX_HELD_BYTES", "Deferral", "Pacer", "Planned", "Release"]

#: The dispatcher's logger: what release control says sits beside what the loop says.
_log = logging.getLogger("delayed_delivery.dispatcher")

#: Longest a slot may be ahead for its message to be held in memory rather than deferred to the store.
HOLD_SECONDS = 1.0
#: Most messages held in memory at once.
MAX_HELD = 20_000
#: Most body bytes held in memory at once.
MAX_HELD_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Release:
    """A message to send now, with its whole-second delay on the queue (module docstring)."""

    message: DelayedMessage
    delay: int = 0
    #: When it is to become visible (epoch seconds): its release slot, or its due time when uncapped.
    slot: float | None = None
    #: Seconds release control adds, reported with this send (its slot after the later of its due time and when it
    #: was planned); None: nothing to report (no cap, or reported when it was deferred).
    lag: float | None = None
    #: Seconds it was already late when it was planned (transport lateness before release control).
    late: float = 0.0

    def lateness(self, arrival: float) -> float:
        """Transport lateness of an arrival at ``arrival``: what it was late before planning, plus after its slot."""
        due = self.message.due_at.timestamp() if self.slot is None else self.slot
        return self.late + max(0.0, arrival - due)


@dataclass(frozen=True, slots=True)
class Deferral:
    """A message for the store to keep until its slot, and the release lag to report for it now."""

    message: DelayedMessage
    slot: datetime
    lag: float | None = None


@dataclass(frozen=True, slots=True)
class Planned:
    """A message with the slot booked for it (epoch seconds), the lag to report and how late it already was."""

    message: DelayedMessage
    slot: float
    lag: float | None
    late: float


@dataclass(order=True, slots=True)
class _Held:
    send_at: float
    seq: int
    message: DelayedMessage = field(compare=False)
    slot: float = field(compare=False)
    delay: int = field(compare=False)
    lag: float | None = field(compare=False)
    late: float = field(compare=False)


def _epoch(when: datetime) -> float:
    return when.timestamp()


class Pacer:
    """Holds, places or defers fetched messages so that each leaves at its slot (module docstring)."""

    def __init__(
        self,
        planner: ReleasePlanner,
        transport: Transport,
        store: object,
        *,
        hold_seconds: float = HOLD_SECONDS,
        max_held: int = MAX_HELD,
        max_held_bytes: int = MAX_HELD_BYTES,
        state: ReleaseStateStore | None = None,
    ) -> None:
        # state: where the release schedule is kept between runs (loaded on the first paced run, saved before what a
        # batch booked more than a second ahead is sent, and at each run's end)
        self.planner = planner
        placing = isinstance(transport, PlacingTransport) and transport.max_delay_seconds >= 1
        self.placing = transport if placing and isinstance(transport, PlacingTransport) else None
        self.deferring = store if isinstance(store, DeferringStore) else None
        self.hold_seconds = hold_seconds
        self.max_held = max_held
        self.max_held_bytes = max_held_bytes
        self._heap: list[_Held] = []
        self._bytes = 0
        self._seq = itertools.count()
        self._ready: list[DelayedMessage] = []  # no caps at all: released as fetched, in fetch order
        self.state = state
        self._state_loaded = False
        self._saved: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self._heap) + len(self._ready)

    @property
    def paced(self) -> bool:
        """Whether any destination is capped; without caps every fetched message is released at once."""
        return bool(self.planner)

    @property
    def lookahead(self) -> float:
        """How far ahead of now a fetch may reach: a message due that soon is held until due, not sent early."""
        return self.hold_seconds if self.paced else 0.0

    def has_room(self) -> bool:
        """Whether another batch may be fetched (the held messages are under both bounds)."""
        return len(self) < self.max_held and self._bytes < self.max_held_bytes

    def next_at(self) -> datetime | None:
        """When the earliest held message is to be sent, or None."""
        return datetime.fromtimestamp(self._heap[0].send_at, UTC) if self._heap else None

    def take(self, batch: Sequence[DelayedMessage], now: datetime) -> list[Deferral]:
        """Book slots for a fetched batch and hold it; what the batch booked is saved before any of it is sent.

        With a shared schedule (``SharedReleaseState``: every shard of a table books from one) a batch with a capped
        message books there, after whatever the others booked, so each cap is shared by what each dispatcher has
        due. If no booking sticks (storage down) the batch keeps the slots of its last attempt (logged): other
        dispatchers may overlap them for a while; nothing is lost or sent before it is due.
        """
        if not self.paced:  # released at fetch: nothing to book, nothing to wait for
            self._ready.extend(batch)
            return []
        shared = self.state if isinstance(self.state, SharedReleaseState) else None
        if shared is None or not any(self.planner.rate_for(m.destination) is not None for m in batch):
            deferrals = self.hold(self.plan(batch, now), now)
            self.save_state(now)
            return deferrals
        before = self.planner.snapshot()
        planned: list[Planned] = []

        def plan(latest: Mapping[str, float]) -> Mapping[str, float]:
            self.planner.restore(before)
            self.planner.load(latest)
            planned[:] = self.plan(batch, now)
            self.planner.forget_before(now.timestamp())
            return self.planner.state()

        try:
            shared.book(plan)
            self._saved = self.planner.state()
        except Exception as exc:
            _log.warning("booking release slots in the shared schedule failed: %r", exc, extra={lf.REASON: repr(exc)})
            if not planned:
                self.planner.restore(before)
                planned = self.plan(batch, now)
        return self.hold(planned, now)

    def load_state(self) -> None:
        """Continue the schedule the last run (or the last holder of these rows) saved, once per pacer."""
        if self.state is None or self._state_loaded:
            return
        try:
            saved = self.state.load()
        except Exception as exc:  # start from now: slots may overlap what the last run placed, nothing is lost
            _log.warning("reading the saved release schedule failed: %r", exc, extra={lf.REASON: repr(exc)})
            return
        self.planner.load(saved)
        self._saved = dict(saved)
        self._state_loaded = True

    def save_state(self, now: datetime, *, force: bool = False) -> None:
        """Save the schedule when it booked more than a second ahead beyond what was saved (or at a run's end)."""
        if self.state is None:
            return
        self.planner.forget_before(now.timestamp())  # a schedule free by now matters no more
        state = self.planner.state()
        horizon = now.timestamp() + 1.0
        ahead = any(v > horizon and v > self._saved.get(d, 0.0) for d, v in state.items())
        if not (ahead or (force and state != self._saved)):
            return
        try:
            self.state.save(state)
        except Exception as exc:  # the next holder may overlap these slots for a while; nothing is lost
            _log.warning("saving the release schedule failed: %r", exc, extra={lf.REASON: repr(exc)})
            return
        self._saved = state

    def plan(self, batch: Sequence[DelayedMessage], now: datetime) -> list[Planned]:
        """Book a slot for each message of ``batch`` in the planner (in due order), holding nothing yet."""
        n = _epoch(now)
        planned: list[Planned] = []
        for message in sorted(batch, key=lambda m: m.due_at):
            due = _epoch(message.due_at)
            kept = slot_of(message)
            capped = self.planner.rate_for(message.destination) is not None
            lag: float | None = None
            late = 0.0
            if kept is not None and capped:  # deferred earlier: its lag was reported then
                slot = _epoch(kept)
                self.planner.observe(message.destination, slot)
            else:
                slot = self.planner.slot_epoch(message.destination, due, n)
                if capped:
                    lag, late = max(0.0, slot - max(due, n)), max(0.0, n - due)
            planned.append(Planned(message, slot, lag, late))
        return planned

    def hold(self, planned: Sequence[Planned], now: datetime) -> list[Deferral]:
        """Hold each planned message until it is sent (or placed); the ones to defer to the store are returned."""
        n = _epoch(now)
        deferrals: list[Deferral] = []
        for p in planned:
            deferral = self._hold(p.message, p.slot, p.lag, p.late, n)
            if deferral is not None:
                deferrals.append(deferral)
        return deferrals

    def _hold(
        self, message: DelayedMessage, slot: float, lag: float | None, late: float, now: float
    ) -> Deferral | None:
        """Hold ``message`` until it is sent (placed or at its slot), or return it to be deferred to its slot."""
        ahead = slot - now
        send_at, delay = slot, 0
        if ahead <= 0:
            send_at = now
        elif self.placing is not None and math.floor(ahead) <= self.placing.max_delay_seconds:
            delay = math.floor(ahead)
            send_at = slot - delay
        elif self.placing is not None and self.deferring is None:
            # beyond what the queue can hide, with nowhere else to wait: as far ahead as it can
            send_at, delay = now, self.placing.max_delay_seconds
        elif ahead > self.hold_seconds and self.deferring is not None:
            return Deferral(message, datetime.fromtimestamp(slot, UTC), lag)
        heapq.heappush(self._heap, _Held(send_at, next(self._seq), message, slot, delay, lag, late))
        self._bytes += len(message.body)
        return None

    def due(self, now: datetime) -> list[Release]:
        """Every held message whose sending time has come, in slot order."""
        n = _epoch(now)
        out = [Release(m) for m in self._ready]
        self._ready.clear()
        while self._heap and self._heap[0].send_at <= n:
            held = heapq.heappop(self._heap)
            self._bytes -= len(held.message.body)
            out.append(Release(held.message, held.delay, held.slot, held.lag, held.late))
        return out

    def drain(self, now: datetime, *, may_send: bool) -> tuple[list[Release], list[Deferral]]:
        """Empty the pacer at the end of a run: what to send now (placed, delay rounded up) and what to defer.

        ``may_send`` False (the run lost its right to send, e.g. its lease): nothing is sent; messages no store
        can defer are simply let go (their claims expire, or the caller forgets them).
        """
        n = _epoch(now)
        sends = [Release(m) for m in self._ready] if may_send else []
        deferrals: list[Deferral] = []
        self._ready.clear()
        for held in sorted(self._heap):
            ahead = held.slot - n
            if ahead <= 0 and may_send:
                sends.append(Release(held.message, 0, held.slot, held.lag, held.late))
            elif self.placing is not None and may_send and math.ceil(ahead) <= self.placing.max_delay_seconds:
                sends.append(Release(held.message, max(0, math.ceil(ahead)), held.slot, held.lag, held.late))
            elif self.deferring is not None:
                deferrals.append(Deferral(held.message, datetime.fromtimestamp(max(held.slot, n), UTC), held.lag))
        self._heap.clear()
        self._bytes = 0
        return sends, deferrals
