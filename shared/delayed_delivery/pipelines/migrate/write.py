"""Writing one Spark partition's batches to the target, on the executors, with the ledger as the checkpoint."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from itertools import groupby
from pathlib import Path
from typing import Any

from delayed_delivery.model import DelayedMessage
from delayed_delivery.pipelines.ledger import BatchState, Ledger
from delayed_delivery.pipelines.migrate.load import to_message
from delayed_delivery.pipelines.targets import MigrationTarget, TargetSpec

__all__ = ["read_refusals", "write_partition"]


def write_partition(
    rows: Iterator[Any],
    spec: TargetSpec,
    run_folder: str,
    batch_size: int,
    now_us: int,
    skip: frozenset[int],
) -> None:
    """Write one Spark partition's batches (rows sorted by batch, then the target's key and message id)."""
    ledger = Ledger(run_folder)
    target: MigrationTarget | None = None
    try:
        for batch, group in groupby(rows, key=lambda r: int(r["batch"])):
            if batch in skip:
                continue
            if target is None:
                target = spec.build()
            _write_batch(target, ledger, Path(run_folder), batch, group, batch_size, now_us)
    finally:
        if target is not None:
            target.close()


class _BatchWriter:
    """One batch in flight: chunks of messages to the target, refusals and ``started`` checkpoints recorded."""

    def __init__(self, target: MigrationTarget, ledger: Ledger, run_folder: Path, batch: int) -> None:
        self.target, self.ledger, self.run_folder, self.batch = target, ledger, run_folder, batch
        self.every = target.checkpoint_rows
        prior = (ledger.entry(batch) if self.every else None) or {}
        started = prior.get("state") == BatchState.STARTED.value
        #: Rows of the batch a killed run already sent (a checkpointing target resumes after them).
        self.resume = int(str(prior.get("sent_rows", 0))) if started else 0
        self.written = int(str(prior.get("written", 0))) if self.resume else 0
        self.due_now = int(str(prior.get("already_due", 0))) if self.resume else 0
        self.refused = read_refusals(run_folder, batch) if self.resume else []
        self.consumed = 0
        self.chunk: dict[str, DelayedMessage] = {}  # by id: a repeated id keeps its latest-due row

    def start(self) -> None:
        """Record the batch as started (with what a resumed batch had already sent)."""
        self.ledger.mark(
            self.batch, BatchState.STARTED, sent_rows=self.resume, written=self.written, already_due=self.due_now
        )

    def flush(self) -> None:
        """Send the chunk; a checkpointing target records its refusals, then the rows consumed so far."""
        self.refused.extend(self.target.write(list(self.chunk.values())))
        self.written += len(self.chunk)
        self.chunk = {}
        if self.every:  # refusals first, so the ledger never counts rows whose refusals are not on disk
            _record_refusals(self.run_folder, self.batch, self.refused)
            self.ledger.mark(
                self.batch, BatchState.STARTED, sent_rows=self.consumed, written=self.written, already_due=self.due_now
            )

    def complete(self) -> None:
        """Send what is left, wait for the target, and record the batch as completed."""
        if self.chunk:
            self.flush()
        self.target.flush()
        _record_refusals(self.run_folder, self.batch, self.refused)
        rows = self.written - len(self.refused)
        self.ledger.mark(
            self.batch, BatchState.COMPLETED, rows=rows, already_due=self.due_now, refused=len(self.refused)
        )


def _write_batch(
    target: MigrationTarget,
    ledger: Ledger,
    run_folder: Path,
    batch: int,
    group: Iterable[Any],
    batch_size: int,
    now_us: int,
) -> None:
    """Write one batch; a checkpointing target resumes after the rows its last ``started`` record counted."""
    writer = _BatchWriter(target, ledger, run_folder, batch)
    size = min(batch_size, writer.every) if writer.every else batch_size
    writer.start()
    for position, row in enumerate(group):
        if position < writer.resume:
            continue
        mid = row["message_id"]
        if mid not in writer.chunk and len(writer.chunk) >= size:  # ids are sorted: a repeat never straddles sends
            writer.flush()
        writer.chunk[mid] = to_message(row)
        writer.due_now += row["due_us"] <= now_us
        writer.consumed = position + 1
    writer.complete()


def _refusals_path(run_folder: Path, batch: int) -> Path:
    return run_folder / "refused" / f"batch-{batch:05d}.jsonl"


def read_refusals(run_folder: Path, batch: int | None = None) -> list[tuple[str, str]]:
    """(message id, reason) the target refused, for one batch or (``batch`` None) every batch."""
    paths = (
        [_refusals_path(run_folder, batch)]
        if batch is not None
        else sorted((run_folder / "refused").glob("batch-*.jsonl"))
    )
    items = [json.loads(line) for p in paths if p.exists() for line in p.read_text().splitlines() if line.strip()]
    return [(str(i["message_id"]), str(i["reason"])) for i in items]


def _record_refusals(run_folder: Path, batch: int, refused: Sequence[tuple[str, str]]) -> None:
    """Write (or clear) the batch's refusals: ``refused/batch-NNNNN.jsonl``, one ``{message_id, reason}`` a line."""
    path = _refusals_path(run_folder, batch)
    if not refused:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"message_id": m, "reason": r}) + "\n" for m, r in refused))
