"""Command-line front ends for the Spark jobs: ``migrate preview|run|abort`` and ``report``.

Importing this module does not import PySpark; each command starts Spark only when it runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from delayed_delivery.app.cli.output import emit_json, err, print_table, say, styled, warn
from delayed_delivery.pipelines.cli import (
    legacy_table,
    migration_options,
    preview_totals,
    summary_rows,
    target_url,
    to_json,
)
from delayed_delivery.pipelines.schema import BodyEncoding, LegacyShape

if TYPE_CHECKING:
    from delayed_delivery.pipelines.migrate import MigrationSummary

__all__ = ["migrate_app", "register", "report_command"]

migrate_app = typer.Typer(
    name="migrate",
    help="Migrate legacy timeouts (timeout-manager or delayed-store exports) into native delayed delivery.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

Source = Annotated[str, typer.Option("--source", "-s", help="Export file or folder (Parquet, CSV or JSON lines).")]
Fmt = Annotated[str | None, typer.Option("--format", help="parquet, csv or json (default: from the extension).")]
Shape = Annotated[LegacyShape | None, typer.Option("--shape", help="Legacy shape (default: from the columns).")]
BodyEnc = Annotated[BodyEncoding, typer.Option("--body-encoding", help="How text exports hold the body.")]
SourceEndpoint = Annotated[
    str | None, typer.Option("--source-endpoint", help="Endpoint name for delayed-store exports without one.")
]
Cutoff = Annotated[
    str | None, typer.Option("--cutoff", help="Migrate only timeouts due after this ISO time (UTC if no offset).")
]
Endpoints = Annotated[list[str] | None, typer.Option("--endpoint", "-e", help="Only this endpoint (repeatable).")]
Batches = Annotated[int, typer.Option("--batches", help="Resumable units the run is split into.")]
Master = Annotated[str | None, typer.Option("--master", help="Spark master (default local[*], or spark-submit's).")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
Target = Annotated[
    str,
    typer.Option(
        "--target",
        "-t",
        help="sqlite:PATH, postgresql://…, azure-table:TABLE, sqs:REGION, or s3buckets (the S3 time-bucket tier).",
    ),
]
MaxBatches = Annotated[int | None, typer.Option("--max-batches", help="Stop after this many batches (resume later).")]
LegacyTableName = Annotated[
    str | None,
    typer.Option(
        "--legacy-table",
        help="Legacy table the generated hide/restore SQL works on (default: TimeoutData, or <endpoint>.timeouts).",
    ),
]
LegacySchema = Annotated[
    str | None, typer.Option("--legacy-schema", help="Its schema (default: the connection's search path).")
]
BucketName = Annotated[
    str | None,
    typer.Option(
        "--bucket-name", help="With --target s3buckets: the tier's S3 bucket (default $DELAYED_DELIVERY_BUCKET_NAME)."
    ),
]
BucketPrefix = Annotated[
    str | None,
    typer.Option("--prefix", help="With --target s3buckets: the tier's key prefix (default delayed-delivery/buckets)."),
]
EndpointUrl = Annotated[
    str | None, typer.Option("--endpoint-url", help="With --target s3buckets: the S3 endpoint (moto, LocalStack).")
]


@migrate_app.command("preview")
def preview(
    source: Source,
    output: Annotated[str, typer.Option("--output", "-o", help="Folder for the histogram chart.")] = "migration",
    fmt: Fmt = None,
    shape: Shape = None,
    body_encoding: BodyEnc = BodyEncoding.BASE64,
    source_endpoint: SourceEndpoint = None,
    cutoff: Cutoff = None,
    endpoint: Endpoints = None,
    master: Master = None,
    as_json: AsJson = False,
) -> None:
    """Show what a run would migrate: counts, due extremes, rejects, a 4-hour warning and a histogram chart."""
    from delayed_delivery.pipelines.migrate import preview_migration
    from delayed_delivery.pipelines.session import get_session

    options = migration_options(source, "", fmt, shape, body_encoding, source_endpoint, cutoff, endpoint, 16)
    result = preview_migration(get_session(master, "delayed-delivery-migrate-preview"), options, output)
    if as_json:
        emit_json(json.loads(to_json(result)))
        return
    table = Table(title=f"Timeouts to migrate from {source}")
    for col in ("endpoint", "destination", "timeouts", "earliest due", "latest due"):
        table.add_column(col, justify="right" if col == "timeouts" else "left")
    for row in result.by_destination:
        table.add_row(
            row.endpoint, row.destination, f"{row.count:,}", row.earliest_due.isoformat(), row.latest_due.isoformat()
        )
    print_table(table)
    say(preview_totals(result))
    for reason, count in result.rejects_by_reason:
        say(f"  rejected {count:,}: {reason}")
    if result.chart:
        say(f"due-date histogram ({result.bucket}s): {result.chart}")
    if result.warning:
        warn(result.warning)


@migrate_app.command("run")
def run(
    source: Source,
    target: Target,
    output: Annotated[str, typer.Option("--output", "-o", help="Folder for the ledger and rejects.")] = "migration",
    run_id: Annotated[str | None, typer.Option("--run-id", help="Run id (default: a hash of the arguments).")] = None,
    fmt: Fmt = None,
    shape: Shape = None,
    body_encoding: BodyEnc = BodyEncoding.BASE64,
    source_endpoint: SourceEndpoint = None,
    cutoff: Cutoff = None,
    endpoint: Endpoints = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Count only; write nothing.")] = False,
    batches: Batches = 16,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Messages per target write.")] = 500,
    max_batches: MaxBatches = None,
    legacy_table_name: LegacyTableName = None,
    legacy_schema: LegacySchema = None,
    bucket_name: BucketName = None,
    prefix: BucketPrefix = None,
    endpoint_url: EndpointUrl = None,
    master: Master = None,
    as_json: AsJson = False,
) -> None:
    """Migrate: rejects to the output folder, batches recorded in the ledger, a rerun resumes.

    Also writes migrated-ids/ and legacy/hide|restore.<dialect>.sql to hide the migrated rows from the legacy table.
    """
    from delayed_delivery.pipelines.migrate import run_migration
    from delayed_delivery.pipelines.session import get_session

    target = target_url(target, bucket_name, prefix, endpoint_url)
    options = migration_options(source, target, fmt, shape, body_encoding, source_endpoint, cutoff, endpoint, batches)
    legacy = legacy_table(legacy_table_name, legacy_schema)
    spark = get_session(master, "delayed-delivery-migrate")
    with _progress(show=err.is_terminal) as on_progress:
        summary = run_migration(
            spark,
            options,
            output,
            run_id=run_id,
            dry_run=dry_run,
            batch_size=batch_size,
            max_batches=max_batches,
            on_progress=on_progress,
            legacy_table=legacy,
        )
    if as_json:
        emit_json(json.loads(to_json(summary)))
        return
    _print_summary(summary)


@contextmanager
def _progress(*, show: bool) -> Iterator[Callable[[int, int], None]]:
    """A rows-migrated progress bar (hidden when not shown); yields the job's progress callback."""
    with Progress(
        TextColumn("migrating", style="bold"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err,
        disable=not show,
        transient=False,
    ) as progress:
        task = progress.add_task("rows", total=None)

        def on_progress(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        yield on_progress


def _print_summary(summary: MigrationSummary) -> None:
    table = Table(title=f"migration {summary.run_id}{' (dry run)' if summary.dry_run else ''} → {summary.target}")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for name, value in summary_rows(summary):
        table.add_row(name, value)
    print_table(table)


@migrate_app.command("abort")
def abort(
    run_id: Annotated[str, typer.Option("--run-id", help="The run to undo.")],
    output: Annotated[str, typer.Option("--output", "-o", help="The run's output folder.")] = "migration",
    target: Annotated[
        str | None, typer.Option("--target", "-t", help="The run's target again, to supply a password.")
    ] = None,
    master: Master = None,
) -> None:
    """Undo what a run wrote where the target allows it (SQLite, tables); say so plainly where it cannot (SQS)."""
    from delayed_delivery.pipelines.migrate import abort_migration
    from delayed_delivery.pipelines.session import get_session

    result = abort_migration(get_session(master, "delayed-delivery-migrate-abort"), output, run_id, target)
    if not result.undone:
        say(styled(f"cannot abort run {run_id}:", "red", result.note), stderr=True)
        raise typer.Exit(code=1)
    say(f"aborted run {run_id} ({result.batches} batches): {result.note}")


def report_command(
    logs: Annotated[str, typer.Option("--logs", "-l", help="JSON-lines log file or folder.")],
    output: Annotated[str, typer.Option("--output", "-o", help="Folder for tables, charts and summary.md.")] = "report",
    master: Master = None,
    as_json: AsJson = False,
) -> None:
    """Report what happened to delayed messages: lateness, duplicates, hops, error queue, throughput, cost."""
    from delayed_delivery.pipelines.report import build_report, check_paths
    from delayed_delivery.pipelines.session import get_session

    check_paths(logs, output)  # before Spark starts: a wrong path is one line at once
    result = build_report(get_session(master, "delayed-delivery-report"), logs, output)
    if as_json:
        emit_json(json.loads(to_json(result)))
        return
    say(result.summary_markdown)  # unwrapped: its tables stay tables
    say(f"written to {result.output}")


def register(app: typer.Typer) -> None:
    """Add ``migrate`` and ``report`` to the main CLI."""
    app.add_typer(migrate_app, name="migrate")
    app.command("report")(report_command)
