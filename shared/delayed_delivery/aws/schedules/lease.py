"""A shard's lease: one worker at a time (a timer pass, or an operator's write), and the pass it must finish.

The lease item (``layout``: ``pk = "lease#NN"``, ``sk = "lease"``) holds ``owner`` and ``until`` (epoch ms). Taking
it is one conditional ``UpdateItem`` (free, expired, or already ours) returning the old item, which tells whether the
last timer pass on the shard finished (``pass_done``) and, if not, the ``pass_now`` it planned with: the next timer
replays that pass as planned (the same occurrences, the same new pages), so a crash anywhere in a pass converges. A
timer records its pass with its first batch (before its first send), and ``finish`` marks it done and frees the lease.

Within a pass, the timer consumes due pages in *batches* and journals each batch in the lease item before its first
send (``pass_pages``: the pages' keys, ``pass_written``: whether the advanced entries are written). A replay finds
the batch: written, it only deletes the batch's pages; not written, it processes exactly those pages again (the
same new pages, whose keys come from the batch).

A worker whose lease expired while it worked is not fenced out of SQS (a send cannot be made conditional): it stops
taking pages once less than ``margin`` of its lease is left, so only a worker stalled longer than that (a frozen
process) can overlap the next holder; what both send then has the same ids (docs/schedules.md, "On AWS").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from ...clock import Clock
from ...errors import TransientError
from .layout import instant, lease_pk, micros
from .table import translate

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

__all__ = ["ACQUIRE", "BEGIN", "BEGIN_JOURNAL", "FINISH", "JOURNAL", "RELEASE", "WRITTEN", "Held", "ShardLeases"]

#: The update expressions (a fake DynamoDB in the benchmarks answers exactly these).
ACQUIRE = "SET #o = :o, #u = :u"
ACQUIRE_IF = "attribute_not_exists(#u) OR #u < :now OR #o = :o"
BEGIN = "SET pass_now = :p, pass_done = :f"
FINISH = "SET pass_done = :t, #u = :zero REMOVE pass_pages, pass_written"
JOURNAL = "SET pass_pages = :b, pass_written = :f"
#: The first batch of a pass records the pass too (an idle pass writes nothing but its lease).
BEGIN_JOURNAL = "SET pass_now = :p, pass_done = :f, pass_pages = :b, pass_written = :f"
WRITTEN = "SET pass_written = :t"
RELEASE = "SET #u = :zero"
OWNED = "#o = :o"
_NAMES = {"#o": "owner", "#u": "until"}


@dataclass(frozen=True, slots=True)
class Held:
    """A lease taken: the shard, its owner token, until when (epoch ms), and the unfinished pass to replay."""

    shard: int
    owner: str
    until_ms: int
    #: The ``now`` an earlier timer pass planned with and did not finish (replay it), or None.
    unfinished: datetime | None = None
    #: That pass's batch in progress: its pages' keys, and whether their advanced entries were written.
    batch: tuple[str, ...] = ()
    batch_written: bool = False

    def left(self, now: datetime) -> float:
        """Seconds of the lease left at ``now``."""
        return self.until_ms / 1000 - now.timestamp()


class ShardLeases:
    """Takes, marks and frees shard leases in the schedules table."""

    def __init__(self, client: DynamoDBClient, table: str, clock: Clock, *, seconds: float = 150.0) -> None:
        self.client = client
        self.table = table
        self.clock = clock
        self.seconds = seconds

    def _key(self, shard: int) -> dict[str, Any]:
        return {"pk": {"S": lease_pk(shard)}, "sk": {"S": "lease"}}

    def acquire(self, shard: int, owner: str) -> Held | None:
        """Take the shard's lease for ``seconds``; None when another owner holds it."""
        now_ms = math.floor(self.clock.now().timestamp() * 1000)
        until = now_ms + math.ceil(self.seconds * 1000)
        try:
            reply = self.client.update_item(
                TableName=self.table,
                Key=self._key(shard),
                UpdateExpression=ACQUIRE,
                ConditionExpression=ACQUIRE_IF,
                ExpressionAttributeNames=_NAMES,
                ExpressionAttributeValues={":o": {"S": owner}, ":u": {"N": str(until)}, ":now": {"N": str(now_ms)}},
                ReturnValues="ALL_OLD",
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
                return None
            raise translate(exc, f"taking the lease of schedule shard {shard}", self.table) from exc
        except BotoCoreError as exc:
            raise translate(exc, f"taking the lease of schedule shard {shard}", self.table) from exc
        old = reply.get("Attributes", {})
        done = old.get("pass_done", {}).get("BOOL", True)
        planned = old.get("pass_now", {}).get("N")
        if done or not isinstance(planned, str) or not planned.isdigit():
            return Held(shard, owner, until)
        keys = old.get("pass_pages", {}).get("L", [])
        batch = tuple(k["S"] for k in keys if isinstance(k, dict) and isinstance(k.get("S"), str))
        written = bool(old.get("pass_written", {}).get("BOOL", False))
        return Held(shard, owner, until, instant(int(planned)), batch, written)

    def unfinished(self, shard: int) -> bool:
        """Whether the shard's last pass did not finish (one eventually consistent read, no write)."""
        try:
            reply = self.client.get_item(TableName=self.table, Key=self._key(shard))
        except (ClientError, BotoCoreError) as exc:
            raise translate(exc, f"reading the lease of schedule shard {shard}", self.table) from exc
        item = reply.get("Item", {})
        return item.get("pass_done", {}).get("BOOL", True) is False and "pass_now" in item

    def wait(self, shard: int, owner: str, seconds: float) -> Held:
        """Take the lease, waiting up to ``seconds`` for its holder (an operator's write); ``TransientError`` else."""
        deadline = self.clock.now().timestamp() + seconds
        pause = 0.05
        while True:
            held = self.acquire(shard, owner)
            if held is not None:
                return held
            if self.clock.now().timestamp() >= deadline:
                raise TransientError(
                    f"schedule shard {shard} is busy (a timer pass or another operator holds its lease): try again"
                )
            self.clock.sleep(pause)
            pause = min(1.0, pause * 2)

    def begin(self, held: Held, now: datetime) -> None:
        """Record the pass about to start (planned at ``now``), before its first send."""
        self._owned(held, BEGIN, {":p": {"N": str(micros(now))}, ":f": {"BOOL": False}}, "recording a pass")

    def journal(self, held: Held, pages: list[str], begin: datetime | None = None) -> None:
        """Record the batch of due pages about to be consumed (before its first send); ``begin``: the ``now`` of
        the pass it is the first batch of (recorded with it)."""
        values: dict[str, Any] = {":b": {"L": [{"S": k} for k in pages]}, ":f": {"BOOL": False}}
        if begin is None:
            self._owned(held, JOURNAL, values, "recording a batch")
            return
        values[":p"] = {"N": str(micros(begin))}
        self._owned(held, BEGIN_JOURNAL, values, "recording a pass and its batch")

    def written(self, held: Held) -> None:
        """The batch's advanced entries are written: a replay only deletes its pages."""
        self._owned(held, WRITTEN, {":t": {"BOOL": True}}, "recording a batch written")

    def finish(self, held: Held) -> None:
        """The pass is done: mark it and free the lease."""
        self._owned(held, FINISH, {":t": {"BOOL": True}, ":zero": {"N": "0"}}, "finishing a pass")

    def release(self, held: Held) -> None:
        """Free the lease (an operator's write is done; a pass's record is left as it is)."""
        self._owned(held, RELEASE, {":zero": {"N": "0"}}, "freeing the lease")

    def _owned(self, held: Held, expression: str, values: dict[str, Any], what: str) -> None:
        try:
            self.client.update_item(
                TableName=self.table,
                Key=self._key(held.shard),
                UpdateExpression=expression,
                ConditionExpression=OWNED,
                ExpressionAttributeNames={k: v for k, v in _NAMES.items() if k in expression + OWNED},
                ExpressionAttributeValues={**values, ":o": {"S": held.owner}},
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
                raise TransientError(f"{what} on schedule shard {held.shard}: the lease was lost (it expired)") from exc
            raise translate(exc, f"{what} on schedule shard {held.shard}", self.table) from exc
        except BotoCoreError as exc:
            raise translate(exc, f"{what} on schedule shard {held.shard}", self.table) from exc
