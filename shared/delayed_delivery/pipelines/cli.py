"""The Spark jobs' own command line (argparse, standard library): ``migrate preview|run|abort`` and ``report``.

It needs neither typer nor rich, so ``spark-submit`` can run it on a bare cluster; ``delayed-delivery migrate``
and ``delayed-delivery report`` are the same commands with progress bars and tables. Spark starts only when a
command runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from datetime import datetime
from typing import TYPE_CHECKING, Any

from delayed_delivery.errors import ConfigurationError, DelayedDeliveryError
from delayed_delivery.pipelines.legacy_sql import LegacyTable
from delayed_delivery.pipelines.schema import BodyEncoding, LegacyShape, parse_due_time

if TYPE_CHECKING:
    from delayed_delivery.pipelines.migrate import MigrationOptions, MigrationSummary, PreviewResult

__all__ = [
    "build_parser",
    "legacy_table",
    "main",
    "migration_options",
    "parse_cutoff",
    "preview_totals",
    "summary_rows",
    "target_url",
    "to_json",
]

#: Exit status for a mistake the user can fix (bad option, unknown run, missing file).
EXIT_USAGE = 2
#: Exit status when ``migrate abort`` cannot take back what the run wrote.
EXIT_CANNOT_ABORT = 1


# -- helpers shared with the typer front end (delayed_delivery.app.cli.pipelines) --------------------------


def parse_cutoff(value: str | None) -> datetime | None:
    """The ``--cutoff`` option as an aware time (UTC when it has no offset)."""
    if value is None:
        return None
    try:
        return parse_due_time(value)
    except ValueError:
        raise ConfigurationError(f"--cutoff {value!r} is not an ISO-8601 time (e.g. 2026-03-01T00:00:00Z)") from None


def migration_options(
    source: str,
    target: str,
    fmt: str | None,
    shape: LegacyShape | None,
    body_encoding: BodyEncoding,
    source_endpoint: str | None,
    cutoff: str | None,
    endpoints: Sequence[str] | None,
    batches: int,
) -> MigrationOptions:
    """The migration options from the command-line values (a local source must exist: checked before Spark starts)."""
    from pathlib import Path

    from delayed_delivery.pipelines.migrate import MigrationOptions

    if ("://" not in source or source.startswith("file://")) and not Path(source.removeprefix("file://")).exists():
        raise ConfigurationError(f"source {source!r} does not exist (give --source an export file or folder)")
    return MigrationOptions(
        source=source,
        target=target,
        source_format=fmt,
        shape=shape,
        body_encoding=body_encoding,
        source_endpoint=source_endpoint,
        cutoff=parse_cutoff(cutoff),
        endpoints=tuple(endpoints or ()),
        batches=batches,
    )


def target_url(
    target: str, bucket_name: str | None = None, prefix: str | None = None, endpoint_url: str | None = None
) -> str:
    """``--target``; for ``s3buckets``, the tier's URL from ``--bucket-name``, ``--prefix`` and ``--endpoint-url``."""
    from delayed_delivery.pipelines.bucket_target import BUCKET_SCHEME, bucket_target_url

    if target == BUCKET_SCHEME:
        return bucket_target_url(bucket_name, prefix, endpoint_url)
    if bucket_name or prefix or endpoint_url:
        raise ConfigurationError("--bucket-name, --prefix and --endpoint-url go with --target s3buckets")
    return target


def legacy_table(table: str | None, schema: str | None) -> LegacyTable | None:
    """``--legacy-table`` and ``--legacy-schema``; None for the shape's usual table."""
    if not (table or schema):
        return None
    if not table:
        raise ConfigurationError("--legacy-schema needs --legacy-table")
    return LegacyTable(table, schema=schema)


def preview_totals(result: PreviewResult) -> str:
    """The preview's headline counts on one line."""
    return (
        f"to migrate: {result.to_migrate:,}   rejected: {result.rejected:,}   left by cutoff: {result.before_cutoff:,}"
        f"   other endpoints: {result.other_endpoints:,}   already due: {result.already_due:,}"
    )


def summary_rows(summary: MigrationSummary) -> list[tuple[str, str]]:
    """A run's summary as (measure, value) rows."""
    return [
        ("rows selected", f"{summary.to_migrate:,}"),
        ("rejected (see rejects folder)", f"{summary.rejected:,}"),
        ("batches done earlier (skipped)", f"{summary.batches_skipped} of {summary.batches}"),
        ("batches written now", str(summary.batches_written)),
        ("rows written now", f"{summary.rows_written:,}"),
        ("refused by the target (see refused folder)", f"{summary.refused:,}"),
        ("already due (delivered at once)", f"{summary.already_due:,}"),
        ("rows / s", f"{summary.rows_per_second:,.0f}"),
        ("run state", summary.state),
        ("rejects", summary.rejects_path or "-"),
        ("migrated ids", summary.migrated_ids_path or "-"),
        ("legacy hide/restore SQL", summary.legacy_scripts or "-"),
    ]


def to_json(result: Any) -> str:
    """A result dataclass as JSON (times in ISO-8601); a run summary also carries ``rows_per_second``."""
    data = asdict(result)
    if hasattr(result, "rows_per_second"):
        data["rows_per_second"] = result.rows_per_second
    return json.dumps(data, indent=2, default=lambda v: v.isoformat() if isinstance(v, datetime) else str(v))


# -- the parser ----------------------------------------------------------------------------------------


def _source_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--source", "-s", required=True, help="Export file or folder (Parquet, CSV or JSON lines).")
    p.add_argument("--format", dest="fmt", metavar="FORMAT", help="parquet, csv or json (default: from the extension).")
    p.add_argument(
        "--shape", type=LegacyShape, choices=list(LegacyShape), help="Legacy shape (default: from the columns)."
    )
    p.add_argument(
        "--body-encoding",
        type=BodyEncoding,
        choices=list(BodyEncoding),
        default=BodyEncoding.BASE64,
        help="How text exports hold the body.",
    )
    p.add_argument("--source-endpoint", help="Endpoint name for delayed-store exports without one.")
    p.add_argument("--cutoff", help="Migrate only timeouts due after this ISO time (UTC if no offset).")
    p.add_argument("--endpoint", "-e", action="append", help="Only this endpoint (repeatable).")


def _common(p: argparse.ArgumentParser, *, as_json: bool = True) -> None:
    p.add_argument("--master", help="Spark master (default local[*], or spark-submit's).")
    if as_json:
        p.add_argument("--json", dest="as_json", action="store_true", help="Print JSON for scripts.")


def _run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target",
        "-t",
        required=True,
        help="sqlite:PATH, postgresql://…, azure-table:TABLE, sqs:REGION, or s3buckets (the S3 time-bucket tier).",
    )
    p.add_argument(
        "--bucket-name", help="With --target s3buckets: the tier's S3 bucket (default $DELAYED_DELIVERY_BUCKET_NAME)."
    )
    p.add_argument(
        "--prefix", help="With --target s3buckets: the tier's key prefix (default delayed-delivery/buckets)."
    )
    p.add_argument("--endpoint-url", help="With --target s3buckets: the S3 endpoint (moto, LocalStack).")
    p.add_argument("--output", "-o", default="migration", help="Folder for the ledger and rejects.")
    p.add_argument("--run-id", help="Run id (default: a hash of the arguments).")
    p.add_argument("--dry-run", action="store_true", help="Count only; write nothing.")
    p.add_argument("--batches", type=int, default=16, help="Resumable units the run is split into.")
    p.add_argument("--batch-size", type=int, default=500, help="Messages per target write.")
    p.add_argument("--max-batches", type=int, help="Stop after this many batches (resume later).")
    p.add_argument(
        "--legacy-table",
        help="Legacy table the generated hide/restore SQL works on (default: TimeoutData, or <endpoint>.timeouts).",
    )
    p.add_argument("--legacy-schema", help="Its schema (default: the connection's search path).")


def build_parser() -> argparse.ArgumentParser:
    """The parser for ``migrate preview|run|abort`` and ``report``."""
    parser = argparse.ArgumentParser(
        prog="python -m delayed_delivery.pipelines", description="The delayed-delivery Spark jobs."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="{migrate,report}")
    migrate = commands.add_parser("migrate", help="Migrate legacy timeouts into native delayed delivery.")
    steps = migrate.add_subparsers(dest="step", required=True, metavar="{preview,run,abort}")
    preview = steps.add_parser("preview", help="Show what a run would migrate.")
    _source_options(preview)
    preview.add_argument("--output", "-o", default="migration", help="Folder for the histogram chart.")
    _common(preview)
    preview.set_defaults(handler=_preview)
    run = steps.add_parser("run", help="Migrate: a rerun with the same arguments resumes.")
    _source_options(run)
    _run_options(run)
    _common(run)
    run.set_defaults(handler=_run)
    abort = steps.add_parser("abort", help="Undo what a run wrote where the target allows it.")
    abort.add_argument("--run-id", required=True, help="The run to undo.")
    abort.add_argument("--output", "-o", default="migration", help="The run's output folder.")
    abort.add_argument("--target", "-t", help="The run's target again, to supply a password.")
    _common(abort, as_json=False)
    abort.set_defaults(handler=_abort)
    report = commands.add_parser("report", help="Report what happened to delayed messages, from the logs.")
    report.add_argument("--logs", "-l", required=True, help="JSON-lines log file or folder.")
    report.add_argument("--output", "-o", default="report", help="Folder for tables, charts and summary.md.")
    _common(report)
    report.set_defaults(handler=_report)
    return parser


# -- the commands --------------------------------------------------------------------------------------


def _session(master: str | None, name: str) -> Any:
    from delayed_delivery.pipelines.session import get_session

    return get_session(master, name)


def _options_of(args: argparse.Namespace, target: str, batches: int) -> MigrationOptions:
    return migration_options(
        args.source, target, args.fmt, args.shape, args.body_encoding, args.source_endpoint, args.cutoff,
        args.endpoint, batches,
    )  # fmt: skip


def _preview(args: argparse.Namespace) -> int:
    from delayed_delivery.pipelines.migrate import preview_migration

    options = _options_of(args, "", 16)
    result = preview_migration(_session(args.master, "delayed-delivery-migrate-preview"), options, args.output)
    if args.as_json:
        print(to_json(result))
        return 0
    print(f"Timeouts to migrate from {args.source}")
    for row in result.by_destination:
        due = f"{row.earliest_due.isoformat()} … {row.latest_due.isoformat()}"
        print(f"  {row.endpoint}  {row.destination}  {row.count:,} timeouts, due {due}")
    print(preview_totals(result))
    for reason, count in result.rejects_by_reason:
        print(f"  rejected {count:,}: {reason}")
    if result.chart:
        print(f"due-date histogram ({result.bucket}s): {result.chart}")
    if result.warning:
        print(f"warning: {result.warning}", file=sys.stderr)
    return 0


def _progress_printer() -> Callable[[int, int], None] | None:
    """Progress lines on stderr when it is a terminal (a pipe would fill up unread)."""
    if not sys.stderr.isatty():
        return None
    last: list[tuple[int, int]] = []

    def show(done: int, total: int) -> None:
        if not last or last[-1] != (done, total):
            last[:] = [(done, total)]
            print(f"migrating: {done:,} of {total:,} rows", file=sys.stderr)

    return show


def _run(args: argparse.Namespace) -> int:
    from delayed_delivery.pipelines.migrate import run_migration

    target = target_url(args.target, args.bucket_name, args.prefix, args.endpoint_url)
    options = _options_of(args, target, args.batches)
    legacy = legacy_table(args.legacy_table, args.legacy_schema)
    summary = run_migration(
        _session(args.master, "delayed-delivery-migrate"),
        options,
        args.output,
        run_id=args.run_id,
        dry_run=args.dry_run,
        batch_size=args.batch_size,
        max_batches=args.max_batches,
        on_progress=None if args.as_json else _progress_printer(),
        legacy_table=legacy,
    )
    if args.as_json:
        print(to_json(summary))
        return 0
    print(f"migration {summary.run_id}{' (dry run)' if summary.dry_run else ''} → {summary.target}")
    rows = summary_rows(summary)
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    return 0


def _abort(args: argparse.Namespace) -> int:
    from delayed_delivery.pipelines.migrate import abort_migration

    spark = _session(args.master, "delayed-delivery-migrate-abort")
    result = abort_migration(spark, args.output, args.run_id, args.target)
    if not result.undone:
        print(f"cannot abort run {args.run_id}: {result.note}", file=sys.stderr)
        return EXIT_CANNOT_ABORT
    print(f"aborted run {args.run_id} ({result.batches} batches): {result.note}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from delayed_delivery.pipelines.report import build_report, check_paths

    check_paths(args.logs, args.output)  # before Spark starts: a wrong path is one line at once
    result = build_report(_session(args.master, "delayed-delivery-report"), args.logs, args.output)
    if args.as_json:
        print(to_json(result))
        return 0
    print(result.summary_markdown)
    print(f"written to {result.output}")
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the command line and run the command; a user's mistake exits 2 with one line on stderr."""
    args = build_parser().parse_args(argv)
    try:
        code = args.handler(args)
    except DelayedDeliveryError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    if code:
        sys.exit(code)
