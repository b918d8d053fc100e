"""Release control: the most messages per second released to each destination, and the slot planner that keeps it.

``release_rates`` maps a destination queue name to its cap (messages per second); the key ``"*"`` is the default
for destinations not named, and a destination mapped to ``null`` (``None``) is unlimited even under ``"*"``. No
rate at all is today's behaviour: every due message is released at once.

The planner gives each message of a capped destination a release *slot*: ``max(due, not_before, next_free)``,
after which the destination's ``next_free`` moves on by ``1 / rate``. Slots are assigned in due order within a
destination (ties in the order given), so a destination's messages keep their order by due time, none is ever
released before it is due, and over any window of ``w`` seconds at most ``rate * w + 1`` slots fall. Nothing is
dropped: a message over the cap only gets a later slot. ``next_free`` per destination is the whole state; it can
be carried from one run to the next (``ReleasePlanner.state`` / ``ReleasePlanner(state=...)``), so a timer that
plans a bucket at a time continues the schedule where the last run left it.

Each route keeps the slots its own way (docs/operations.md, "Bursts and release control"): the core dispatcher
sends at the slot or places the message there with the queue's own delay, Azure with the visibility timeout, SQS
with ``DelaySeconds``.
"""

from __future__ import annotations

import bisect
import json
import math
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .ports import SharedReleaseState

__all__ = [
    "DEFAULT_KEY",
    "MAX_DESTINATIONS",
    "MAX_RATE",
    "RELEASE_RATES_ENV",
    "ReleasePlanner",
    "ReleaseRates",
    "SharedStateSchedule",
    "assign_slots",
    "busiest_window",
    "second_capacity",
]

#: The environment variable holding ``release_rates`` as a JSON object.
RELEASE_RATES_ENV = "DELAYED_DELIVERY_RELEASE_RATES"
#: The key of the default rate (destinations not named).
DEFAULT_KEY = "*"
#: The highest rate accepted (messages per second); far above what any single queue takes.
MAX_RATE = 1_000_000.0
#: The most destinations one ``release_rates`` may name.
MAX_DESTINATIONS = 1000
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,80}")
_MAX_TEXT = 64 * 1024


def _check_rate(name: str, value: object) -> float | None:
    """``value`` as a rate for ``name``: a number in (0, MAX_RATE], or None (unlimited); ``ValueError`` otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"the rate of {name!r} must be a number of messages per second or null, got {value!r}")
    rate = float(value)
    if not math.isfinite(rate) or not 0 < rate <= MAX_RATE:
        raise ValueError(
            f"the rate of {name!r} must be more than 0 and at most {MAX_RATE:,.0f} messages per second "
            f"(leave a destination out, or map it to null, for no cap), got {value!r}"
        )
    return rate


@dataclass(frozen=True, slots=True, repr=False)
class ReleaseRates:
    """Destination -> most messages per second (``"*"``: the default; ``None``: unlimited); empty: no caps."""

    rates: tuple[tuple[str, float | None], ...] = ()
    _index: Mapping[str, float | None] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        seen: dict[str, float | None] = {}
        for name, value in self.rates:
            if not isinstance(name, str) or (name != DEFAULT_KEY and _NAME.fullmatch(name) is None):
                raise ValueError(
                    f"{str(name)[:100]!r} is not a queue name (1-80 ASCII letters, digits, '_', '-' or '.') "
                    f"nor {DEFAULT_KEY!r} (the default)"
                )
            if name in seen:
                raise ValueError(f"{name!r} is given twice")
            seen[name] = _check_rate(name, value)
        if len(seen) > MAX_DESTINATIONS:
            raise ValueError(f"at most {MAX_DESTINATIONS} destinations may be named, got {len(seen)}")
        object.__setattr__(self, "rates", tuple(sorted(seen.items())))
        object.__setattr__(self, "_index", dict(seen))

    @classmethod
    def of(cls, rates: Mapping[str, float | None] | ReleaseRates | None) -> ReleaseRates:
        """From a mapping (``{"orders": 200, "*": 1000}``), or as it is; ``ValueError`` names a bad entry."""
        if rates is None:
            return cls()
        if isinstance(rates, ReleaseRates):
            return rates
        if not isinstance(rates, Mapping):
            raise ValueError(f"release rates are an object of queue name to messages per second, got {rates!r}")
        return cls(tuple((str(name), _check_rate(str(name), rate)) for name, rate in rates.items()))

    @classmethod
    def parse(cls, text: str) -> ReleaseRates:
        """From a JSON object such as ``{"orders": 200, "*": 1000}``; ``ValueError`` says what is wrong."""
        if len(text) > _MAX_TEXT:
            raise ValueError(f"longer than {_MAX_TEXT} characters")
        try:
            value = json.loads(text, parse_constant=_no_constant, object_pairs_hook=_pairs)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise ValueError(f"not JSON ({exc})") from None
        if not isinstance(value, _Pairs):
            raise ValueError(
                f'a JSON object of queue name to messages per second, e.g. {{"orders": 200, "*": 1000}}, '
                f"not a JSON {'array' if isinstance(value, list) else type(value).__name__}"
            )
        return cls(tuple((name, _check_rate(name, rate)) for name, rate in value))

    def to_json(self) -> str:
        """The JSON object form (what ``DELAYED_DELIVERY_RELEASE_RATES`` holds)."""
        return json.dumps({name: _plain(rate) for name, rate in self.rates}, separators=(",", ":"))

    def as_dict(self) -> dict[str, float | None]:
        """A plain dict copy."""
        return dict(self.rates)

    def rate_for(self, destination: str) -> float | None:
        """The cap on ``destination`` (its own, else the default), or None when it is unlimited."""
        if destination in self._index:
            return self._index[destination]
        return self._index.get(DEFAULT_KEY)

    def __bool__(self) -> bool:
        return any(rate is not None for _, rate in self.rates)

    def __str__(self) -> str:
        return self.to_json()

    def __repr__(self) -> str:
        return self.to_json()


class _Pairs(list[tuple[str, object]]):
    """A JSON object as its pairs, so a key given twice is seen (``ReleaseRates`` refuses it)."""


def _pairs(pairs: list[tuple[str, object]]) -> _Pairs:
    return _Pairs(pairs)


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a rate")


def _plain(rate: float | None) -> float | int | None:
    """A rate as JSON writes it: whole numbers without ``.0``."""
    if rate is None or not rate.is_integer():
        return rate
    return int(rate)


def assign_slots(
    rate: float, dues: Sequence[float], next_free: float = -math.inf, not_before: float = -math.inf
) -> tuple[list[float], float]:
    """Release slots (epoch seconds) for ``dues`` at ``rate``/s, and the ``next_free`` to carry on with.

    Slots follow due order (ties keep the order given) and are returned in the order of ``dues``; each is
    ``max(due, not_before, next_free)``, and ``next_free`` moves ``1 / rate`` past it. Pure: the caller keeps
    ``next_free`` (a timer between runs, a dispatcher in memory).
    """
    if not rate > 0:
        raise ValueError(f"rate must be positive, got {rate!r}")
    anchor, taken = next_free, 0  # next_free = anchor + taken / rate, without summing rounding errors
    order = sorted(range(len(dues)), key=dues.__getitem__)
    slots = [0.0] * len(dues)
    for i in order:
        free = anchor + taken / rate
        slot = max(dues[i], not_before)
        if slot > free:
            anchor, taken = slot, 1
        else:
            slot, taken = free, taken + 1
        slots[i] = slot
    return slots, anchor + taken / rate


def second_capacity(rate: float, second: int) -> int:
    """Slots a whole-second calendar gives epoch second ``second`` at ``rate``/s (sums to ``rate`` per second)."""
    return math.floor((second + 1) * rate + 1e-9) - math.floor(second * rate + 1e-9)


def busiest_window(times: Iterable[float], seconds: float) -> int:
    """The most of ``times`` (epoch seconds) inside any half-open window ``[t, t + seconds)``."""
    ordered = sorted(times)
    best = 0
    for i, start in enumerate(ordered):
        best = max(best, bisect.bisect_left(ordered, start + seconds, lo=i) - i)
    return best


def _epoch(when: datetime) -> float:
    return when.timestamp()


def _at(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


class ReleasePlanner:
    """Per-destination slots at the capped rates (``share`` of each: one of N dispatchers sharing a cap)."""

    def __init__(
        self,
        rates: ReleaseRates | Mapping[str, float | None],
        *,
        share: float = 1.0,
        state: Mapping[str, float] | None = None,
    ) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"share must be more than 0 and at most 1, got {share!r}")
        self.rates = ReleaseRates.of(rates)
        self.share = share
        self._next: dict[str, tuple[float, int]] = {}  # next free slot = anchor + taken / rate
        self._lock = threading.Lock()  # ``reserve`` may be called from several threads
        for destination, next_free in (state or {}).items():
            if self.rate_for(destination) is not None and math.isfinite(next_free):
                self._next[destination] = (float(next_free), 0)

    def __bool__(self) -> bool:
        return bool(self.rates)

    def rate_for(self, destination: str) -> float | None:
        """The rate in force for ``destination`` here (its cap times ``share``), or None when unlimited."""
        rate = self.rates.rate_for(destination)
        return None if rate is None else rate * self.share

    def slot(self, destination: str, due: datetime, not_before: datetime) -> datetime:
        """Book and return the next slot of ``destination`` for a message due at ``due`` (``due`` when uncapped)."""
        return _at(self.slot_epoch(destination, _epoch(due), _epoch(not_before)))

    def slot_epoch(self, destination: str, due: float, not_before: float) -> float:
        """``slot`` in epoch seconds."""
        rate = self.rate_for(destination)
        if rate is None:
            return due
        anchor, taken = self._next.get(destination, (-math.inf, 0))
        free = anchor + taken / rate
        slot = max(due, not_before)
        if slot > free:
            self._next[destination] = (slot, 1)
            return slot
        self._next[destination] = (anchor, taken + 1)
        return free

    def plan(self, destination: str, dues: Sequence[float], not_before: float) -> list[float]:
        """Slots (epoch seconds) for ``dues`` of one destination, in due order, returned in the order given."""
        rate = self.rate_for(destination)
        if rate is None:
            return list(dues)
        slots, next_free = assign_slots(rate, dues, self._free(destination, rate), not_before)
        self._next[destination] = (next_free, 0)
        return slots

    def reserve(self, destination: str, dues: Sequence[float], now: float) -> list[float | None]:
        """``ports.ReleaseSchedule``: ``plan`` under a lock, no slot before ``now``."""
        with self._lock:
            return list(self.plan(destination, dues, now))

    def _free(self, destination: str, rate: float) -> float:
        anchor, taken = self._next.get(destination, (-math.inf, 0))
        return anchor + taken / rate

    def observe(self, destination: str, slot: float) -> None:
        """Take a slot booked earlier (a held row coming back, another run's plan) into the schedule."""
        rate = self.rate_for(destination)
        if rate is not None and slot + 1.0 / rate > self._free(destination, rate):
            self._next[destination] = (slot, 1)

    def load(self, state: Mapping[str, float]) -> None:
        """Take a saved schedule in (another run's or holder's ``state()``): no slot before what it booked."""
        for destination, next_free in state.items():
            rate = self.rate_for(destination)
            if rate is not None and math.isfinite(next_free) and next_free > self._free(destination, rate):
                self._next[destination] = (float(next_free), 0)

    def lag(self, destination: str, now: float) -> float:
        """Seconds until ``destination``'s next free slot: how late a message due now would be released."""
        rate = self.rate_for(destination)
        return 0.0 if rate is None else max(0.0, self._free(destination, rate) - now)

    def lags(self, now: float) -> dict[str, float]:
        """``lag`` of every destination with a schedule."""
        return {d: self.lag(d, now) for d in self._next}

    def snapshot(self) -> dict[str, tuple[float, int]]:
        """The whole schedule as it is now, for ``restore`` (a booking that has to be made again)."""
        return dict(self._next)

    def restore(self, snapshot: Mapping[str, tuple[float, int]]) -> None:
        """Go back to a ``snapshot``: every slot booked since is forgotten."""
        self._next = dict(snapshot)

    def state(self) -> dict[str, float]:
        """``next_free`` per destination (epoch seconds): pass it back as ``state`` to continue the schedule."""
        return {d: anchor + taken / (self.rate_for(d) or 1.0) for d, (anchor, taken) in self._next.items()}

    def forget_before(self, now: float) -> None:
        """Drop destinations whose schedule is free by ``now`` (their state no longer matters)."""
        for destination, free in self.state().items():
            if free <= now:
                del self._next[destination]


class SharedStateSchedule:
    """``ports.ReleaseSchedule`` over a ``ports.SharedReleaseState`` (e.g. Azure's blob): each booking plans after
    whatever every other dispatcher booked there and is written only if nobody wrote meanwhile (else planned again).
    """

    def __init__(self, state: SharedReleaseState, rates: ReleaseRates | Mapping[str, float | None]) -> None:
        self.state = state
        self.rates = ReleaseRates.of(rates)

    def reserve(self, destination: str, dues: Sequence[float], now: float) -> list[float | None]:
        """Slots for ``dues`` (epoch seconds) booked in the shared schedule; ``dues`` as they are when uncapped."""
        if self.rates.rate_for(destination) is None:
            return list(dues)
        slots: list[float] = []

        def plan(latest: Mapping[str, float]) -> Mapping[str, float]:
            planner = ReleasePlanner(self.rates, state=latest)
            slots[:] = planner.plan(destination, dues, now)
            return {**latest, **planner.state()}

        self.state.book(plan)
        return list(slots)
