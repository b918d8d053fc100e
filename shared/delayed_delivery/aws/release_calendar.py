"""Release slots for the SQS ``-delay.fifo`` route: a calendar of whole seconds per destination in DynamoDB.

The requeue function runs as many invocations at once as there are message groups (one per message), and a
message reaches its last hop anywhere up to 900 s before it is due, in no particular order. So its release schedule
is not a pointer one process keeps but a calendar all invocations share: one item per destination and epoch second,
``taken`` counting the messages placed to become visible in that second. A second holds ``second_capacity(rate,
second)`` messages (``release.py``: the rate per second on average, whole numbers).

Reserving is one atomic ``UpdateItem ADD taken :n`` returning the new count, ``n`` never above the second's
capacity: of the ``n`` asked, those still under the capacity are granted and the rest given back (``ADD -excess``,
only when another invocation took part of the second first) and asked of the next second. Concurrent
invocations never grant more than a second's capacity between them (each grant is decided from the count its own
atomic add returned), with no conditional failures and no lock; what a failed invocation reserved and never sent
only leaves that capacity unused. The item ``second = -1`` holds ``full_from`` / ``full_to``: the seconds last seen
full in a row, so a burst's later invocations start after them instead of probing every full second again.

A message is placed in the first second ``k`` with room such that it becomes visible no earlier than due: it is
sent with ``DelaySeconds = k - floor(now)`` and so becomes visible at ``k + frac(now)``, within second ``k``. A
second that is more than ``horizon`` (SQS: 900 s) away cannot be reached: such a message gets no slot.

Items: ``destination`` (S, partition key), ``second`` (N, sort key), ``taken`` (N), ``full_from`` and ``full_to``
(N, on the -1 item), ``expires_at`` (N, epoch seconds: DynamoDB's TTL removes an item a day after its second).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from ..errors import ConfigurationError, DelayedDeliveryError, TransientError
from ..release import ReleaseRates, second_capacity
from .config import RELEASE_TABLE_ENV
from .sqs import translate_error
from .ttl_tables import create_ttl_table

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_sqs.type_defs import SendMessageBatchRequestEntryTypeDef

T = TypeVar("T")

__all__ = [
    "DEFAULT_RELEASE_TABLE",
    "RELEASE_TABLE_ENV",
    "Placement",
    "ReleaseCalendar",
    "apply_placements",
    "ensure_release_table",
]

#: The table the CDK stack and ``delayed-delivery aws create`` use unless told otherwise.
DEFAULT_RELEASE_TABLE = "delayed-delivery-release"
TTL_ATTRIBUTE = "expires_at"
#: The sort key of a destination's item recording the seconds last seen full in a row.
_RUN = -1
#: A second's item lives this long after the second (TTL).
_KEEP_S = 86_400
_THROTTLED = {"ProvisionedThroughputExceededException", "RequestLimitExceeded", "ThrottlingException"}


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one message goes: its ``DelaySeconds`` and the seconds release control adds (None: no slot yet)."""

    delay_seconds: int
    lag: float


def _translate(exc: BaseException, what: str, table: str) -> DelayedDeliveryError:
    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code == "ResourceNotFoundException":
            return ConfigurationError(
                f"{what}: release table {table!r} does not exist (the CDK stack creates it with release_rates; on an "
                f"emulator run `delayed-delivery aws create`, or set {RELEASE_TABLE_ENV})"
            )
        if code in _THROTTLED:
            return TransientError(f"{what}: {code}")
    return translate_error(exc, what)


class ReleaseCalendar:
    """The shared release calendar of the destinations ``rates`` caps (module docstring)."""

    def __init__(self, client: DynamoDBClient, table: str, rates: ReleaseRates, *, horizon: int = 900) -> None:
        if not table:
            raise ConfigurationError(f"release control on the FIFO route needs a table: set {RELEASE_TABLE_ENV}")
        self.client = client
        self.table = table
        self.rates = rates
        self.horizon = horizon

    def capped(self, destination: str) -> bool:
        """Whether ``destination`` has a cap."""
        return self.rates.rate_for(destination) is not None

    def place(self, destination: str, dues_ms: Sequence[int], now_ms: int) -> list[Placement | None]:
        """A placement per message due at ``dues_ms`` (epoch ms), in the order given; None: no second with room
        within the horizon. Messages are placed in due order. ``DelayedDeliveryError`` when the table fails."""
        rate = self.rates.rate_for(destination)
        if rate is None:
            return [Placement(max(0, math.ceil((d - now_ms) / 1000)), 0.0) for d in dues_ms]
        now = now_ms / 1000
        base, phase = math.floor(now), now - math.floor(now)
        last = base + self.horizon
        firsts = [max(base, math.ceil(d / 1000 - phase - 1e-9)) for d in dues_ms]
        order = sorted(range(len(dues_ms)), key=lambda i: (dues_ms[i], i))  # due order (so first-second order too)
        out: list[Placement | None] = [None] * len(dues_ms)
        what = f"reserving release slots for {destination!r}"
        try:
            run_from, run_to = self._run(destination) if order else (0, 0)
            second = firsts[order[0]] if order else base
            if run_from <= second < run_to:  # seen full: start after them
                second = run_to
            streak = (run_from, run_to) if second == run_to else (second, second)  # full seconds just behind
            at = 0
            while at < len(order) and second <= last:
                if firsts[order[at]] > second:
                    second = firsts[order[at]]
                    streak = (second, second)
                if second > last:
                    break
                wanting = [i for i in order[at:] if firsts[i] <= second]
                granted = self._take(destination, second, len(wanting), rate)
                for i in wanting[:granted]:
                    out[i] = Placement(second - base, max(0.0, second + phase - max(dues_ms[i] / 1000, now)))
                at += granted
                if granted < len(wanting):
                    if streak[1] == second:
                        streak = (streak[0], second + 1)
                    second += 1
            if streak[1] > max(streak[0], run_to):
                self._mark_full(destination, *streak)
        except (ClientError, BotoCoreError) as exc:
            raise _translate(exc, what, self.table) from exc
        return out

    def reserve(self, destination: str, dues: Sequence[float], now: float) -> list[float | None]:
        """``ports.ReleaseSchedule``: ``place`` in epoch seconds (a slot: when the message becomes visible)."""
        now_ms = math.floor(now * 1000)
        placed = self.place(destination, [math.ceil(due * 1000) for due in dues], now_ms)
        return [None if p is None else now_ms / 1000 + p.delay_seconds for p in placed]

    def _take(self, destination: str, second: int, n: int, rate: float) -> int:
        """Ask ``n`` places of ``second``; how many were granted (the rest are given back). No more than the
        second's capacity is asked, so an empty second costs one call however many wait: at a low rate a burst
        costs one round trip per second it fills, not two."""
        capacity = second_capacity(rate, second)
        if capacity <= 0:
            return 0
        n = min(n, capacity)
        key = {"destination": {"S": destination}, "second": {"N": str(second)}}
        reply = self.client.update_item(
            TableName=self.table,
            Key=key,
            UpdateExpression="ADD taken :n SET expires_at = :e",
            ExpressionAttributeValues={":n": {"N": str(n)}, ":e": {"N": str(second + _KEEP_S)}},
            ReturnValues="ALL_NEW",  # the whole (small) item: UPDATED_NEW is a diff an emulator may get wrong
        )
        total = int(reply["Attributes"]["taken"]["N"])
        granted = max(0, min(n, capacity - (total - n)))
        if granted < n:
            self.client.update_item(
                TableName=self.table,
                Key=key,
                UpdateExpression="ADD taken :n",
                ExpressionAttributeValues={":n": {"N": str(-(n - granted))}},
            )
        return granted

    def _run(self, destination: str) -> tuple[int, int]:
        """The seconds ``[from, to)`` last seen full in a row (a burst's), or ``(0, 0)``."""
        reply = self.client.get_item(TableName=self.table, Key=self._run_key(destination))
        item = reply.get("Item", {})
        low, high = item.get("full_from", {}).get("N"), item.get("full_to", {}).get("N")
        if low is None or high is None or not (low.isdigit() and high.isdigit()):
            return 0, 0
        return int(low), int(high)

    def _mark_full(self, destination: str, low: int, high: int) -> None:
        """Record that seconds ``[low, high)`` are full, unless a run reaching further is recorded already."""
        try:
            self.client.update_item(
                TableName=self.table,
                Key=self._run_key(destination),
                UpdateExpression="SET full_from = :a, full_to = :b, expires_at = :e",
                ConditionExpression="attribute_not_exists(full_to) OR full_to < :b",
                ExpressionAttributeValues={
                    ":a": {"N": str(low)},
                    ":b": {"N": str(high)},
                    ":e": {"N": str(high + _KEEP_S)},
                },
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
                raise

    @staticmethod
    def _run_key(destination: str) -> dict[str, dict[str, str]]:
        return {"destination": {"S": destination}, "second": {"N": str(_RUN)}}

    def lag(self, destination: str, now_ms: int) -> float | None:
        """The current release lag of ``destination``: seconds from now to its first second with room (None: no
        cap; the horizon when none has room within it)."""
        rate = self.rates.rate_for(destination)
        if rate is None:
            return None
        now = now_ms / 1000
        base = math.floor(now)
        try:
            taken = self._taken(destination, base, base + self.horizon)
        except (ClientError, BotoCoreError) as exc:
            raise _translate(exc, f"reading the release calendar of {destination!r}", self.table) from exc
        for second in range(base, base + self.horizon + 1):
            if taken.get(second, 0) < second_capacity(rate, second):
                return max(0.0, second - now)
        return float(self.horizon)

    def _taken(self, destination: str, low: int, high: int) -> dict[int, int]:
        """``taken`` per second from ``low`` to ``high`` (seconds with none are left out)."""
        out: dict[int, int] = {}
        kwargs: dict[str, object] = {}
        while True:
            reply = self.client.query(
                TableName=self.table,
                KeyConditionExpression="destination = :d AND #s BETWEEN :lo AND :hi",
                ExpressionAttributeNames={"#s": "second"},
                ExpressionAttributeValues={
                    ":d": {"S": destination},
                    ":lo": {"N": str(low)},
                    ":hi": {"N": str(high)},
                },
                **kwargs,  # type: ignore[arg-type]
            )
            for item in reply.get("Items", []):
                out[int(item["second"]["N"])] = int(item.get("taken", {}).get("N", "0"))
            if "LastEvaluatedKey" not in reply:
                return out
            kwargs = {"ExclusiveStartKey": reply["LastEvaluatedKey"]}


def apply_placements(
    entries: list[SendMessageBatchRequestEntryTypeDef], owners: list[T], placed: Sequence[Placement | None]
) -> tuple[dict[str, float], list[T]]:
    """Set each placed entry's ``DelaySeconds`` to its slot, in place, keeping in ``entries`` and ``owners`` only the
    placed ones; returns each placed entry's release lag (by entry id) and the owners with no slot."""
    lags: dict[str, float] = {}
    kept: list[SendMessageBatchRequestEntryTypeDef] = []
    kept_owners: list[T] = []
    held: list[T] = []
    for entry, owner, where in zip(entries, owners, placed, strict=True):
        if where is None:
            held.append(owner)
            continue
        entry["DelaySeconds"] = where.delay_seconds
        lags[entry["Id"]] = where.lag
        kept.append(entry)
        kept_owners.append(owner)
    entries[:] = kept
    owners[:] = kept_owners
    return lags, held


def ensure_release_table(client: DynamoDBClient, table: str = DEFAULT_RELEASE_TABLE) -> None:
    """Create the table (on demand, TTL on ``expires_at``) if missing; for emulators and scripts, CDK in the cloud."""
    try:
        create_ttl_table(client, table, "destination", ("second", "N"), TTL_ATTRIBUTE)
    except (ClientError, BotoCoreError) as exc:
        raise _translate(exc, "creating the release table", table) from exc
