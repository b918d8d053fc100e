"""What decides which rows a migration run reads and where it writes them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from delayed_delivery.errors import ConfigurationError
from delayed_delivery.pipelines.ledger import fingerprint
from delayed_delivery.pipelines.schema import BodyEncoding, LegacyShape
from delayed_delivery.pipelines.targets import TargetSpec

__all__ = ["SOURCE_FORMATS", "MigrationOptions"]

#: ``--format`` values (and file extensions) → the Spark reader that reads them.
SOURCE_FORMATS = {"parquet": "parquet", "csv": "csv", "json": "json", "jsonl": "json", "ndjson": "json"}


@dataclass(frozen=True, slots=True)
class MigrationOptions:
    """Everything that decides which rows a run migrates, and where."""

    source: str
    target: str = ""
    source_format: str | None = None
    shape: LegacyShape | None = None
    body_encoding: BodyEncoding = BodyEncoding.BASE64
    source_endpoint: str | None = None
    cutoff: datetime | None = None
    endpoints: tuple[str, ...] = ()
    batches: int = 16

    def __post_init__(self) -> None:
        if self.batches < 1 or self.batches > 100_000:
            raise ConfigurationError("--batches must be between 1 and 100000")
        if self.cutoff is not None and self.cutoff.tzinfo is None:
            object.__setattr__(self, "cutoff", self.cutoff.replace(tzinfo=UTC))

    def format(self) -> str:
        """The source format, from the option or the file extension."""
        if self.source_format:
            fmt = SOURCE_FORMATS.get(self.source_format.lower())
            if fmt is None:
                raise ConfigurationError(f"unknown --format {self.source_format!r}: use parquet, csv or json")
            return fmt
        path = Path(self.source)
        candidates = [path] if path.is_file() else sorted(p for p in path.glob("*") if p.is_file())
        for candidate in candidates:
            fmt = SOURCE_FORMATS.get(candidate.suffix.lstrip(".").lower())
            if fmt is not None:
                return fmt
        raise ConfigurationError(f"cannot tell the format of {self.source!r}: pass --format parquet|csv|json")

    def args(self) -> dict[str, str]:
        """The arguments that identify a run (compared on resume)."""
        return {
            "source": str(Path(self.source).resolve()),
            "target": TargetSpec.parse(self.target).url if self.target else "",
            "format": self.format(),
            "shape": self.shape.value if self.shape else "auto",
            "body_encoding": self.body_encoding.value,
            "source_endpoint": self.source_endpoint or "",
            "cutoff": self.cutoff.isoformat() if self.cutoff else "",
            "endpoints": ",".join(sorted(self.endpoints)),
            "batches": str(self.batches),
        }

    @classmethod
    def from_args(cls, args: dict[str, str]) -> MigrationOptions:
        """Rebuild the options a run was started with."""
        return cls(
            source=args["source"],
            target=args["target"],
            source_format=args["format"],
            shape=None if args["shape"] == "auto" else LegacyShape(args["shape"]),
            body_encoding=BodyEncoding(args["body_encoding"]),
            source_endpoint=args["source_endpoint"] or None,
            cutoff=datetime.fromisoformat(args["cutoff"]) if args["cutoff"] else None,
            endpoints=tuple(e for e in args["endpoints"].split(",") if e),
            batches=int(args["batches"]),
        )

    def default_run_id(self) -> str:
        """``run-`` plus a hash of the arguments, so the same arguments resume the same run."""
        return "run-" + fingerprint(self.args())[:12]
