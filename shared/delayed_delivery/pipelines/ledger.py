"""Run manifest and per-batch ledger under the output folder (plain JSON files, no Spark).

Layout: ``<output>/runs/<run_id>/run.json`` holds the run's arguments and state;
``<output>/runs/<run_id>/ledger/batch-NNNNN.json`` holds one batch's state, moving
``started`` → ``completed`` (or ``aborted``). Targets that checkpoint (SQS) rewrite a ``started``
record after every acknowledged send with ``sent_rows`` (rows of the batch, in the job's sort order,
already written) and the counters so far; a resumed batch skips those rows. Every file is written
to a temporary name and renamed, so a killed run leaves either the old state or the new one, never half a file.
On a cluster the output folder must be a path every executor and the driver can see.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path

from ..errors import ConfigurationError

__all__ = ["BatchState", "Ledger", "RunManifest", "RunState", "fingerprint"]


class BatchState(StrEnum):
    """Where one batch is in the state machine."""

    STARTED = "started"
    COMPLETED = "completed"
    ABORTED = "aborted"


class RunState(StrEnum):
    """Where the whole run is."""

    RUNNING = "running"
    COMPLETED = "completed"
    ABORTED = "aborted"


def fingerprint(args: Mapping[str, str]) -> str:
    """A stable SHA-256 of the run's arguments."""
    return hashlib.sha256(json.dumps(dict(args), sort_keys=True).encode()).hexdigest()


def _write_json(path: Path, payload: Mapping[str, object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload, sort_keys=True, indent=1))
    tmp.replace(path)


def _now() -> str:
    return datetime.now(UTC).isoformat()


@dataclass(frozen=True, slots=True)
class RunManifest:
    """A run's identity: its id, arguments and state."""

    run_id: str
    args: Mapping[str, str]
    state: RunState
    created_at: str

    @staticmethod
    def folder(output: str | os.PathLike[str], run_id: str) -> Path:
        """The run's folder."""
        return Path(output) / "runs" / run_id

    @classmethod
    def load(cls, output: str | os.PathLike[str], run_id: str) -> RunManifest | None:
        """The stored manifest, or None when the run does not exist."""
        path = cls.folder(output, run_id) / "run.json"
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        return cls(data["run_id"], data["args"], RunState(data["state"]), data["created_at"])

    @classmethod
    def open(cls, output: str | os.PathLike[str], run_id: str, args: Mapping[str, str]) -> RunManifest:
        """Start a run or resume it; refuse when the stored arguments differ or it was aborted."""
        existing = cls.load(output, run_id)
        if existing is None:
            manifest = cls(run_id, dict(args), RunState.RUNNING, _now())
            manifest.save(output)
            return manifest
        if dict(existing.args) != dict(args):
            changed = sorted(k for k in set(existing.args) | set(args) if existing.args.get(k) != args.get(k))
            details = "; ".join(f"{k}: was {existing.args.get(k)!r}, now {args.get(k)!r}" for k in changed)
            raise ConfigurationError(
                f"run {run_id!r} was started with different arguments ({details}): rerun with the original "
                "arguments to resume it, or pass a new --run-id"
            )
        if existing.state is RunState.ABORTED:
            raise ConfigurationError(f"run {run_id!r} was aborted: pass a new --run-id to migrate again")
        return existing

    def with_state(self, output: str | os.PathLike[str], state: RunState) -> RunManifest:
        """Store and return a copy in ``state``."""
        updated = RunManifest(self.run_id, self.args, state, self.created_at)
        updated.save(output)
        return updated

    def save(self, output: str | os.PathLike[str]) -> None:
        """Write run.json atomically."""
        _write_json(
            self.folder(output, self.run_id) / "run.json",
            {
                "run_id": self.run_id,
                "args": dict(self.args),
                "fingerprint": fingerprint(self.args),
                "state": self.state.value,
                "created_at": self.created_at,
                "updated_at": _now(),
            },
        )


class Ledger:
    """Per-batch state files for one run; safe to use from executors (one file per batch)."""

    def __init__(self, run_folder: str | os.PathLike[str]) -> None:
        self.folder = Path(run_folder) / "ledger"

    def _path(self, batch: int) -> Path:
        return self.folder / f"batch-{batch:05d}.json"

    def mark(self, batch: int, state: BatchState, **info: object) -> None:
        """Record ``batch`` as ``state`` with extra counters."""
        _write_json(self._path(batch), {"batch": batch, "state": state.value, "at": _now(), **info})

    def entry(self, batch: int) -> dict[str, object] | None:
        """One batch's latest record, or None when it was never started."""
        path = self._path(batch)
        if not path.exists():
            return None
        data: dict[str, object] = json.loads(path.read_text())
        return data

    def entries(self) -> dict[int, dict[str, object]]:
        """Every batch's latest record, by batch number."""
        if not self.folder.exists():
            return {}
        out: dict[int, dict[str, object]] = {}
        for path in sorted(self.folder.glob("batch-*.json")):
            data = json.loads(path.read_text())
            out[int(data["batch"])] = data
        return out

    def in_state(self, state: BatchState) -> set[int]:
        """Batch numbers currently in ``state``."""
        return {b for b, e in self.entries().items() if e.get("state") == state.value}
