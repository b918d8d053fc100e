"""Deterministic synthetic data: legacy timeout exports and dispatcher log files, any size, by seed."""

from __future__ import annotations

import base64
import csv
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from delayed_delivery.errors import ConfigurationError
from delayed_delivery.pipelines.schema import LegacyShape

__all__ = ["SyntheticExport", "legacy_rows", "write_legacy_export", "write_logs"]

#: The reference "now" synthetic data is built around, unless another is given.
DEFAULT_NOW = datetime(2026, 1, 1, tzinfo=UTC)

_ENDPOINTS = ("Sales", "Billing", "Shipping", "Warehouse")
_DESTINATIONS = ("orders", "invoices", "shipments", "stock", "audit")
_MALFORMED = ("missing destination", "unparsable time", "unparsable headers")


@dataclass(frozen=True, slots=True)
class SyntheticExport:
    """What a generated export holds, for assertions."""

    path: str
    rows: int
    malformed: int


def legacy_rows(
    shape: LegacyShape,
    count: int,
    *,
    seed: int = 1,
    now: datetime = DEFAULT_NOW,
    malformed_every: int = 0,
    max_delay_days: float = 400.0,
    overdue_fraction: float = 0.01,
) -> Iterator[dict[str, object]]:
    """Yield ``count`` legacy rows (body as base64 text); every ``malformed_every``-th row is broken."""
    rng = random.Random(seed)
    for i in range(count):
        endpoint = _ENDPOINTS[rng.randrange(len(_ENDPOINTS))]
        if rng.random() < overdue_fraction:
            due = now - timedelta(seconds=rng.uniform(1, 3600))
        else:
            due = now + timedelta(seconds=rng.uniform(60, max_delay_days * 86_400))
        headers = {"NServiceBus.MessageId": f"m-{seed}-{i}", "NServiceBus.OriginatingEndpoint": endpoint}
        row: dict[str, object] = {
            "Id": f"{seed:04d}-{i:010d}",
            "Destination": _DESTINATIONS[rng.randrange(len(_DESTINATIONS))],
            "State": base64.b64encode(f'{{"order":{i},"seed":{seed}}}'.encode()).decode(),
            "Time": due.strftime("%Y-%m-%d %H:%M:%S.%f"),
            "Headers": json.dumps(headers),
        }
        if shape is LegacyShape.TIMEOUT_MANAGER:
            row["SagaId"] = f"saga-{rng.randrange(1_000_000)}" if rng.random() < 0.5 else ""
            row["Endpoint"] = endpoint
        else:
            row["RetryCount"] = 0
        if malformed_every and i % malformed_every == malformed_every - 1:
            kind = _MALFORMED[(i // malformed_every) % len(_MALFORMED)]
            if kind == "missing destination":
                row["Destination"] = ""
            elif kind == "unparsable time":
                row["Time"] = "not-a-time"
            else:
                row["Headers"] = "{broken"
        yield row


def write_legacy_export(
    path: str | Path,
    shape: LegacyShape,
    count: int,
    *,
    fmt: str = "csv",
    seed: int = 1,
    now: datetime = DEFAULT_NOW,
    malformed_every: int = 0,
    files: int = 1,
) -> SyntheticExport:
    """Write a legacy export (csv or json lines; one or more files in folder ``path``)."""
    if fmt not in ("csv", "json"):
        raise ConfigurationError("the generator writes csv or json; convert to Parquet with Spark if needed")
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    rows = legacy_rows(shape, count, seed=seed, now=now, malformed_every=malformed_every)
    per_file = -(-count // max(1, files))
    for f in range(max(1, files)):
        target = folder / f"part-{f:04d}.{'csv' if fmt == 'csv' else 'jsonl'}"
        with target.open("w", newline="", encoding="utf-8") as out:
            writer: csv.DictWriter[str] | None = None
            for _ in range(per_file):
                row = next(rows, None)
                if row is None:
                    break
                if fmt == "json":
                    out.write(json.dumps(row) + "\n")
                    continue
                if writer is None:
                    writer = csv.DictWriter(out, fieldnames=list(row))
                    writer.writeheader()
                writer.writerow(row)
    malformed = count // malformed_every if malformed_every else 0
    return SyntheticExport(str(folder), count, malformed)


def write_logs(
    path: str | Path,
    messages: int,
    *,
    seed: int = 1,
    start: datetime = DEFAULT_NOW,
    duplicate_every: int = 50,
    error_every: int = 40,
) -> int:
    """Write dispatcher JSON-lines logs for ``messages`` messages (stored, hops, dispatch); return the line count."""
    rng = random.Random(seed)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    lines = 0
    with target.open("w", encoding="utf-8") as out:

        def emit(record: dict[str, object]) -> None:
            nonlocal lines
            out.write(json.dumps(record) + "\n")
            lines += 1

        for i in range(messages):
            mid = f"msg-{seed}-{i}"
            endpoint = _ENDPOINTS[i % len(_ENDPOINTS)]
            dest = _DESTINATIONS[i % len(_DESTINATIONS)]
            delay = rng.choice((30, 600, 1800, 7200, 86_400, 5 * 86_400, 40 * 86_400)) * rng.uniform(0.9, 1.1)
            stored = start + timedelta(seconds=rng.uniform(0, 3600))
            due = stored + timedelta(seconds=delay)
            cloud = "aws" if i % 2 == 0 else "azure"
            base = {"message_id": mid, "destination": dest, "endpoint": endpoint, "cloud": cloud}
            emit({**base, "timestamp": stored.isoformat(), "event": "stored", "due_at": due.isoformat()})
            if cloud == "aws":
                hops = max(0, int((delay - 900) // 900) + (1 if delay > 900 else 0))
                for h in range(1, hops + 1):
                    left = max(0.0, delay - 900 * h)
                    t = stored + timedelta(seconds=900 * h)
                    event = "requeued" if left > 900 else "forwarded"
                    emit(
                        {**base, "timestamp": t.isoformat(), "event": event, "hop": h, "remaining_delay_s": round(left)}
                    )
            if error_every and i % error_every == error_every - 1:
                reason = rng.choice(("DestinationNotFoundError('orders')", "PermanentError('poison message')"))
                emit({**base, "timestamp": due.isoformat(), "event": "moved_to_error_queue", "reason": reason})
                continue
            lateness = round(rng.expovariate(1 / 0.8), 3)
            at = due + timedelta(seconds=lateness)
            emit(
                {
                    **base,
                    "timestamp": at.isoformat(),
                    "event": "dispatched",
                    "due_at": due.isoformat(),
                    "lateness_s": lateness,
                }
            )
            if duplicate_every and i % duplicate_every == duplicate_every - 1:
                emit({**base, "timestamp": (at + timedelta(seconds=1)).isoformat(), "event": "already_removed"})
    return lines
