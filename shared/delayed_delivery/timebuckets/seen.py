"""What a dispatch worker met of its partition up to a point of its plan: a snapshot (``delayed-delivery-seen/1``).

A worker admits each message of its partition once, in plan order (the first copy of a message is sent, a later copy
skipped). A worker that starts again mid-partition must know what was met before its progress point. Reading the
lines before that point again can take longer than an invocation (gigabytes of lines in one partition), so a worker
writes what it met, its *seen set*, at a point it recorded (at its deadline, and when the partition is done), and the
next one starts from there: it reads again only the lines between the snapshot and the progress (#31).

The same snapshots keep a lost plan from resending: a new plan of the bucket (the old one expired or was damaged)
starts its workers with every message the old plan's workers handed on (sent, cancelled, moved, to the error queue),
so finished partitions are not sent again. A message written back into the bucket (it waits in another object) is
marked, and the new plan sends that copy.

Between two snapshots a worker writes a *delta* after every piece it sent, before the progress that names the piece:
the messages met since the snapshot or delta before it (``delta`` true in the header; the same format, so a reader
that knows no deltas takes one for a small snapshot). A snapshot and the deltas after it hold everything met up to
the last delta's point, so a plan lost after a kill repeats at most the piece in hand.

The object is gzip-compressed JSON lines: a header, then one line per message met, ``[id, due ms, digest, written
back (0 or 1)]``, ``digest`` being the first 16 hex characters of ``identity.content_digest``. Bounded and validated
when read (``InvalidMessageError`` with the reason); ``tests/golden/s3_seen.v1.json`` and
``tests/golden/s3_seen_delta.v1.json`` pin it.
"""

from __future__ import annotations

import gzip
import json
import zlib
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidMessageError
from ..jsonbounds import loads_bounded
from ..model import is_usable_message_id
from ..validation import is_whole
from .identity import DIGEST_CHARS
from .plans import require_whole
from .wheel import FINE, BucketKey

__all__ = [
    "MAX_SEEN_BYTES",
    "MAX_SEEN_ENTRIES",
    "SEEN_FORMAT",
    "SeenEntry",
    "SeenSnapshot",
    "decode_seen",
    "encode_seen",
]

SEEN_FORMAT = "delayed-delivery-seen/1"
#: The most messages one snapshot holds (a partition remembers at most ``timer_plan.SEEN_LIMIT``).
MAX_SEEN_ENTRIES = 1_000_000
#: The most bytes a snapshot holds once decompressed (an entry is at most about 300).
MAX_SEEN_BYTES = 320 * 1024 * 1024
_MAX_MS = 220_898_664_000_000
_HEX = frozenset("0123456789abcdef")

#: ``(message id, due ms, digest as an int, written back)``
SeenEntry = tuple[str, int, int, bool]


@dataclass(frozen=True, slots=True)
class SeenSnapshot:
    """The messages a partition met up to ``(object, line)`` of its plan (the place its progress names)."""

    bucket: BucketKey
    plan_ms: int
    partition: int
    partitions: int
    object: int
    line: int
    done: bool
    #: Messages met but not remembered (the partition met more than it keeps).
    overflow: int
    entries: tuple[SeenEntry, ...]
    #: Only what was met since the snapshot or delta before it (written after a piece), not everything.
    delta: bool = False

    def __post_init__(self) -> None:
        what = "seen snapshot"
        if self.bucket.level != FINE:
            raise InvalidMessageError(f"{what}: for a fine bucket")
        checks = (
            ("plan_ms", self.plan_ms, 0, _MAX_MS - 1),
            ("partitions", self.partitions, 1, 256),
            ("partition", self.partition, 0, self.partitions - 1 if is_whole(self.partitions) else 0),
            ("object", self.object, 0, 1_000_000),
            ("line", self.line, 0, 10_000_000),
            ("overflow", self.overflow, 0, 10**12),
        )
        require_whole(checks, what)
        if not isinstance(self.done, bool):
            raise InvalidMessageError(f"{what}: done must be true or false")
        if not isinstance(self.delta, bool):
            raise InvalidMessageError(f"{what}: delta must be true or false")
        if len(self.entries) > MAX_SEEN_ENTRIES:
            raise InvalidMessageError(f"{what}: more than {MAX_SEEN_ENTRIES:,} entries")

    @property
    def position(self) -> tuple[int, int]:
        """Where in the plan it was taken: (object index, line)."""
        return self.object, self.line


def encode_seen(snapshot: SeenSnapshot) -> bytes:
    """The snapshot object's bytes (gzip, fixed header: the same snapshot gives the same bytes)."""
    header = {
        "format": SEEN_FORMAT,
        "bucket": snapshot.bucket.iso,
        "plan_ms": snapshot.plan_ms,
        "partition": snapshot.partition,
        "partitions": snapshot.partitions,
        "object": snapshot.object,
        "line": snapshot.line,
        "done": snapshot.done,
        "overflow": snapshot.overflow,
        "count": len(snapshot.entries),
    }
    if snapshot.delta:  # absent from a whole snapshot: its bytes are those of before deltas
        header["delta"] = True
    lines = [json.dumps(header, separators=(",", ":"))]
    for message_id, due_ms, digest, written in snapshot.entries:
        entry = [message_id, due_ms, f"{digest:0{DIGEST_CHARS}x}", 1 if written else 0]
        lines.append(json.dumps(entry, ensure_ascii=True, separators=(",", ":")))
    return gzip.compress(("\n".join(lines) + "\n").encode("ascii"), compresslevel=6, mtime=0)


def _entry(line: str, number: int) -> SeenEntry:
    value: Any = loads_bounded(line, what=f"seen snapshot line {number}", max_chars=2_000, max_depth=1)
    if not isinstance(value, list) or len(value) != 4:
        raise InvalidMessageError(f"seen snapshot line {number}: not [id, due, digest, written back]")
    message_id, due_ms, digest, written = value
    if not is_usable_message_id(message_id):
        raise InvalidMessageError(f"seen snapshot line {number}: not a message id")
    if not is_whole(due_ms, 0, _MAX_MS - 1):
        raise InvalidMessageError(f"seen snapshot line {number}: due {str(due_ms)[:40]} is not epoch milliseconds")
    if not isinstance(digest, str) or len(digest) != DIGEST_CHARS or not set(digest) <= _HEX:
        raise InvalidMessageError(f"seen snapshot line {number}: digest is not {DIGEST_CHARS} hex characters")
    if written not in (0, 1) or isinstance(written, bool):
        raise InvalidMessageError(f"seen snapshot line {number}: written back must be 0 or 1")
    return message_id, due_ms, int(digest, 16), written == 1


def decode_seen(data: bytes) -> SeenSnapshot:
    """A snapshot read back; ``InvalidMessageError`` names what is wrong."""
    what = "seen snapshot"
    try:
        inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
        text = inflate.decompress(bytes(data), MAX_SEEN_BYTES + 1)
    except zlib.error as exc:
        raise InvalidMessageError(f"{what}: not gzip ({exc})") from None
    if len(text) > MAX_SEEN_BYTES or not inflate.eof:
        raise InvalidMessageError(f"{what}: cut short, or more than {MAX_SEEN_BYTES:,} bytes")
    try:
        lines = text.decode("ascii").split("\n")
    except UnicodeDecodeError:
        raise InvalidMessageError(f"{what}: not ASCII") from None
    if lines and lines[-1] == "":
        lines.pop()
    if not lines:
        raise InvalidMessageError(f"{what}: empty")
    header = loads_bounded(lines[0], what=f"{what} header", max_chars=2_000, max_depth=1)
    if not isinstance(header, dict) or header.get("format") != SEEN_FORMAT:
        raise InvalidMessageError(f"{what}: format is not {SEEN_FORMAT!r}")
    count = header.get("count")
    if not is_whole(count, 0, MAX_SEEN_ENTRIES) or count != len(lines) - 1:
        raise InvalidMessageError(f"{what}: the header announces {str(count)[:20]} entries, it holds {len(lines) - 1}")
    start = header.get("bucket")
    if not isinstance(start, str):
        raise InvalidMessageError(f"{what}: bucket must be text")
    names = ("plan_ms", "partition", "partitions", "object", "line", "done", "overflow")
    missing = [name for name in names if name not in header]
    if missing:
        raise InvalidMessageError(f"{what}: missing {', '.join(missing)}")
    entries = tuple(_entry(line, n) for n, line in enumerate(lines[1:], 1))
    fields = {name: header[name] for name in names}
    return SeenSnapshot(BucketKey.parse(FINE, start), **fields, entries=entries, delta=header.get("delta", False))
