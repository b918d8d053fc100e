"""The ``delayed-delivery`` command line."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from importlib.util import find_spec
from typing import TYPE_CHECKING, Annotated, Any

import typer
import typer.main
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from delayed_delivery import __version__
from delayed_delivery.app.cli.cost import register_cost_command
from delayed_delivery.app.cli.local import local_app
from delayed_delivery.app.cli.ops import register_operator_commands
from delayed_delivery.app.cli.output import emit_json, err, fail, out, plain_console, print_table, say, styled
from delayed_delivery.app.cli.schedule import schedule_app
from delayed_delivery.app.demo.core import DemoProgress, run_core_demo
from delayed_delivery.durations import format_duration
from delayed_delivery.errors import DelayedDeliveryError, extra_missing
from delayed_delivery.logjson import JsonFormatter
from delayed_delivery.redact import redact
from delayed_delivery.schedules.zones import tz_database

if TYPE_CHECKING:
    from delayed_delivery.app.demo.cloud import CloudDemoConfig, CloudDemoResult, CloudProgress, CloudSummary

app = typer.Typer(
    name="delayed-delivery",
    help="Unrestricted delayed delivery for cloud queues: any delay, on time, never lost.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        say(f"delayed-delivery {__version__}")
        say(f"time zones: {tz_database().describe()}")  # what recurring schedules are evaluated with
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Unrestricted delayed delivery for cloud queues."""


def _fail(message: str) -> typer.Exit:
    return fail(message)


register_cost_command(app)  # first: the command list keeps its order (cost, demo, send, ...)


def _progress_table(p: DemoProgress) -> Table:
    t = Table(title="delayed-delivery local demo (SQLite store, 2 dispatchers)")
    for col in ("sent", "pending", "delivered", "error queue"):
        t.add_column(col, justify="right")
    t.add_row(str(p.sent), str(p.pending), str(p.delivered), str(p.error_queue))
    return t


@app.command()
def demo(
    quick: Annotated[bool, typer.Option("--quick", help="Fewer messages, shorter run (under 2 minutes).")] = False,
    core: Annotated[
        bool, typer.Option("--core", help="The core-only demo: SQLite store, no emulators, no cloud SDKs.")
    ] = False,
    messages: Annotated[
        int | None, typer.Option(help="Messages per cloud (default 45, quick 18; core: 240 / 80).")
    ] = None,
    year_seconds: Annotated[
        float | None, typer.Option("--year-seconds", help="Real seconds that 1 year is compressed into.")
    ] = None,
    cloud: Annotated[str, typer.Option(help="Run on aws, azure or both.")] = "both",
    span: Annotated[float | None, typer.Option(help="--core only: real seconds that 2 years take.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Stream the functions' JSON logs to stderr.")
    ] = False,
) -> None:
    """Run the demo on local emulators: moto server (SQS) and Azurite, started and stopped for you.

    Sends delays from 0 s to "1 year" (compressed: 1 year = 45 s, quick 25 s) through both clouds, plus poison
    messages, one cancelled and one rescheduled, and on Azure a burst to one capped destination (release_rates);
    runs the SQS requeue Lambda and the Azure timer function in-process; prints live progress and a summary.
    Exits 1 if anything was lost.

    Example: delayed-delivery demo --quick      (core-only, no emulators: delayed-delivery demo --core)
    """
    _configure_logging(verbose)
    if core:
        _core_demo(quick, messages, span, as_json, verbose)
        return
    config = _cloud_demo_config(quick, cloud, messages, year_seconds)
    stdout = plain_console(file=sys.stdout)  # bound now: the functions' stdout is redirected while they run
    try:
        result = _run_cloud_demo(config, stdout, as_json, verbose)
    except DelayedDeliveryError as exc:
        raise _fail(str(exc)) from None
    if as_json:
        emit_json(result.as_dict(), file=stdout.file)
    else:
        print_table(_cloud_summary_table(result), stdout)
        for c in result.clouds:
            for note in c.notes:
                stdout.print(styled(f"note ({c.cloud}):", "yellow", note), soft_wrap=True)
    if not result.ok:
        raise typer.Exit(code=1)


def _cloud_demo_config(quick: bool, cloud: str, messages: int | None, year_seconds: float | None) -> CloudDemoConfig:
    """The cloud demo's settings from the command's options (exit 2 on a bad one or a missing extra)."""
    if cloud not in ("aws", "azure", "both"):
        raise _fail("--cloud must be aws, azure or both")
    if (messages is not None and messages < 1) or (year_seconds is not None and year_seconds <= 0):
        raise _fail("--messages and --year-seconds must be positive")
    missing = missing_extras("aws", "azure", "local")
    if missing:
        hint = extra_missing("the cloud demo", "cli", *missing)
        raise _fail(f"{hint}; or run the demo without clouds: delayed-delivery demo --core")
    from delayed_delivery.app.demo.cloud import CloudDemoConfig

    config = CloudDemoConfig.quick() if quick else CloudDemoConfig()
    config = replace(config, aws=cloud != "azure", azure=cloud != "aws")
    if messages is not None:
        config = replace(config, messages_per_cloud=messages)
    if year_seconds is not None:
        config = replace(config, year_seconds=year_seconds)
    return config


def _run_cloud_demo(config: CloudDemoConfig, out: Console, as_json: bool, verbose: bool) -> CloudDemoResult:
    """Run the cloud demo, with a live progress table on a terminal (not with --json or --verbose)."""
    from delayed_delivery.app.demo.cloud import run_cloud_demo

    status = None if as_json else (lambda text: err.print(Text(text, style="dim"), soft_wrap=True))
    if as_json or verbose or not sys.stdout.isatty():
        return run_cloud_demo(config, on_status=status, verbose=verbose)
    first: list[float] = []

    def show(progress: list[CloudProgress]) -> None:
        if not first:  # the first report comes once everything is sent
            first.append(time.monotonic())
        live.update(_cloud_progress_table(progress, time.monotonic() - first[0], config.compression))

    with Live(_cloud_progress_table([]), console=out, refresh_per_second=8) as live:
        return run_cloud_demo(config, on_progress=show, on_status=status, verbose=verbose)


def _cloud_progress_table(progress: list[CloudProgress], elapsed: float = 0.0, compression: float = 1.0) -> Table:
    t = Table(
        title="delayed-delivery demo on local emulators (moto server + Azurite)",
        caption=f"{elapsed:.0f} s since sending ≈ {format_duration(elapsed * compression)} of compressed time",
    )
    t.add_column("cloud")
    for col in ("sent", "pending (not due)", "in flight (due)", "delivered", "error queue"):
        t.add_column(col, justify="right")
    for p in progress:
        t.add_row(p.cloud, str(p.sent), str(p.pending), str(p.in_flight), str(p.delivered), str(p.error_queue))
    return t


def _cloud_summary_table(result: CloudDemoResult) -> Table:
    by = {c.cloud: c for c in result.clouds}
    names = [c.cloud for c in result.clouds]
    t = Table(
        title=f"demo summary: 1 s = {format_duration(result.compression)}, "
        f"1 year = {result.year_seconds:g} s, run {result.seconds:.0f} s"
    )
    t.add_column("measure")
    for name in names:
        t.add_column("AWS (SQS)" if name == "aws" else "Azure (Storage Queues)", justify="right")

    def row(label: str | Text, value: Callable[[CloudSummary], object]) -> None:
        t.add_row(label, *(str(value(by[n])) for n in names))

    row("sent (incl. poison, cancelled)", lambda c: c.sent)
    row("delivered / expected", lambda c: f"{c.delivered} / {c.expected_deliveries}")
    row(Text("lost (must be 0)", style="bold"), lambda c: c.lost)
    row("duplicates", lambda c: c.duplicates)
    row("early (must be 0)", lambda c: c.early)
    row("error queue / poison sent", lambda c: f"{c.error_queue} / {c.expected_error_queue}")
    row(
        "cancelled (delivered anyway)",
        lambda c: f"{c.cancelled} ({c.cancelled_but_delivered})" if c.cancelled else "n/a",
    )
    row(
        "rescheduled (arrived after the new due)",
        lambda c: (
            f"{c.rescheduled} ({', '.join('-' if x is None else f'{x:+.1f} s' for x in c.rescheduled_lateness)})"
            if c.rescheduled
            else "n/a"
        ),
    )
    row("lateness p50 (compressed s)", lambda c: f"{c.lateness_p50:.2f}")
    row("lateness p99 (compressed s)", lambda c: f"{c.lateness_p99:.2f}")
    row("routes", lambda c: ", ".join(f"{k} {v}" for k, v in sorted(c.routes.items())))
    pad = [""] * (len(names) - 1)
    if "aws" in by:
        _aws_request_rows(t, by["aws"].requests, pad)
        if by["aws"].buckets:
            from delayed_delivery.app.demo.cloud_buckets import tier_summary_rows

            for label, value in tier_summary_rows(by["aws"].buckets):
                t.add_row(label, value, *pad)
    if "azure" in by:
        _azure_request_rows(t, by["azure"].requests, pad)
        if by["azure"].release:
            from delayed_delivery.app.demo.cloud_release import release_summary_rows

            for label, value in release_summary_rows(by["azure"].release):
                t.add_row(label, *pad, value)
    _recurring_rows(t, [by[n].recurring for n in names])
    return t


def _recurring_rows(t: Table, recurring: list[dict[str, Any]]) -> None:
    """Each cloud's recurring schedule (one column each; a cloud that did not run one shows a dash)."""
    from delayed_delivery.app.demo.cloud_recurring import recurring_summary_rows

    ran = [recurring_summary_rows(r) if r else None for r in recurring]
    template = next((rows for rows in ran if rows is not None), None)
    for i, (label, _) in enumerate(template or []):
        t.add_row(label, *("-" if rows is None else rows[i][1] for rows in ran))


def _aws_request_rows(t: Table, aws: dict[str, float], pad: list[str]) -> None:
    """The SQS request counts of the demo summary (the AWS column is the first)."""
    t.add_row("SQS requests per message per hop", f"{aws['requests_per_hop']:.2f}", *pad)
    t.add_row("SQS hops (per long-delay message)", f"{aws['hops']:.0f} ({aws['hops_per_long_message']:.1f})", *pad)
    if aws.get("parks"):
        t.add_row("SQS parks (hidden on -delay.fifo instead of hopping)", f"{aws['parks']:.0f}", *pad)
    t.add_row(
        "SQS requests per message (+ empty receives)",
        f"{aws['requests_per_message']:.2f} (+{aws['empty_receives']:.0f})",
        *pad,
    )
    if "cancellation_queries" in aws:
        t.add_row(
            "cancellation table: Query / DeleteItem",
            f"{aws['cancellation_queries']:.0f} / {aws['cancellation_deletes']:.0f}",
            *pad,
        )


def _azure_request_rows(t: Table, az: dict[str, float], pad: list[str]) -> None:
    """The Azure storage transactions of the demo summary (the Azure column is the last)."""
    t.add_row("Azure storage transactions per message", *pad, f"{az['requests_per_message']:.2f}")
    t.add_row(
        "  of which the function: table / queue / blob",
        *pad,
        f"{az['function_table_requests']:.0f} / {az['function_queue_requests']:.0f} / "
        f"{az['function_blob_requests']:.0f}",
    )
    t.add_row("  timer runs", *pad, f"{az['timer_runs']:.0f}")


def _core_demo(quick: bool, messages: int | None, span: float | None, as_json: bool, verbose: bool) -> None:
    """The core-only demo: SQLite store and two dispatchers, no emulators."""
    count = messages if messages is not None else (80 if quick else 240)
    seconds = span if span is not None else (6.0 if quick else 12.0)
    if count < 1 or seconds <= 0:
        raise _fail("--messages and --span must be positive")
    quiet = as_json or verbose or not sys.stdout.isatty()
    if quiet:
        result = run_core_demo(messages=count, span_seconds=seconds)
    else:
        with Live(_progress_table(DemoProgress()), console=out, refresh_per_second=8) as live:
            result = run_core_demo(
                messages=count, span_seconds=seconds, on_progress=lambda p: live.update(_progress_table(p))
            )
    if as_json:
        emit_json(asdict(result))
    else:
        summary = Table(title="demo summary")
        summary.add_column("measure")
        summary.add_column("value", justify="right")
        for name, value in (
            ("sent", result.sent),
            ("delivered", result.delivered),
            ("lost (must be 0)", result.lost),
            ("duplicates", result.duplicates),
            ("error queue (poison, expected)", f"{result.error_queue} ({result.expected_error_queue})"),
            ("lateness p50 (real s)", f"{result.lateness_p50:.3f}"),
            ("lateness p99 (real s)", f"{result.lateness_p99:.3f}"),
            ("lateness max (real s)", f"{result.lateness_max:.3f}"),
            (
                f"release control: {result.release_destination} capped at {result.release_rate:g}/s",
                f"busiest second {result.release_busiest_second}",
            ),
            (
                f"  release lag p50 / p99 / max (real s, {result.release_destination})",
                f"{result.release_lag_p50:.2f} / {result.release_lag_p99:.2f} / {result.release_lag_max:.2f}",
            ),
            ("time compression", f"1 s = {format_duration(result.compression)}"),
            ("sent by dispatcher", ", ".join(f"{k}: {v}" for k, v in sorted(result.by_dispatcher.items()))),
            ("run time (s)", f"{result.seconds:.1f}"),
        ):
            summary.add_row(name, str(value))
        print_table(summary)
    if result.lost or result.error_queue != result.expected_error_queue:
        raise typer.Exit(code=1)


register_operator_commands(app)
app.add_typer(local_app, name="local")
app.add_typer(schedule_app, name="schedule")


class _RedactingFormatter(JsonFormatter):
    """JSON log lines with URL passwords and storage keys masked (a driver error may quote a connection string)."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


def _configure_logging(verbose: bool) -> None:
    """JSON lines on stderr when verbose; otherwise only critical errors."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_RedactingFormatter())
    root = logging.getLogger("delayed_delivery")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO if verbose else logging.CRITICAL)
    root.propagate = False


def _installed(module: str) -> bool:
    """Whether ``module`` can be imported (its extra is installed); a broken install still fails at import."""
    try:
        return find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


#: The modules each optional extra brings, as the command line checks for them.
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "aws": ("boto3", "aws_lambda_powertools"),
    "azure": ("azure.storage.queue", "azure.storage.blob", "azure.data.tables"),
    "spark": ("pyspark", "matplotlib"),
    "local": ("moto", "flask"),
}


def missing_extras(*extras: str) -> list[str]:
    """Which of ``extras`` are not (fully) installed."""
    return [e for e in extras if not all(_installed(m) for m in EXTRA_MODULES[e])]


def _needs_extra(name: str, extras: tuple[str, ...], help: str) -> None:
    """Register ``name`` as a command that says, in one line and exit 2, which extra it needs."""
    what = f"`delayed-delivery {name}`"

    def missing(ctx: typer.Context) -> None:
        raise fail(str(extra_missing(what, "cli", *missing_extras(*extras))))

    missing.__doc__ = f"{help} (needs the {' and '.join(extras)} extra: not installed)"
    settings = {"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []}
    app.command(name, context_settings=settings)(missing)


def _register_extras() -> None:
    """Add the command groups whose extra is installed: aws (boto3), azure (Storage SDKs), spark (PySpark).

    A group whose extra is missing is still listed, and running it says which extra to install (exit 2).
    """
    if not missing_extras("aws"):
        from delayed_delivery.app.cli.aws import aws_app

        app.add_typer(aws_app, name="aws")
    else:
        _needs_extra("aws", ("aws",), "SQS: check, create, send, run the requeue and the time-bucket tier locally")
    if not missing_extras("azure"):
        from delayed_delivery.app.cli.azure import azure_app

        app.add_typer(azure_app, name="azure")
    else:
        _needs_extra("azure", ("azure",), "Azure Storage Queues: package, set up, send, dispatch")
    if not missing_extras("spark"):
        from delayed_delivery.app.cli.pipelines import register

        register(app)
    else:
        _needs_extra("migrate", ("spark",), "Migrate legacy timeouts into native delayed delivery (Spark)")
        _needs_extra("report", ("spark",), "Report what happened to delayed messages, from their logs (Spark)")


_register_extras()


def _hide_flag_types(command: Any, parent: Any = None) -> None:
    """No ``<bool>`` type column for flags (``--json``, ``--help``, …): a flag takes no value."""
    context = command.context_class(command, parent=parent, info_name=command.name)
    params = [*command.params, command.get_help_option(context)]
    for param in params:
        if getattr(param, "is_flag", False):
            param.metavar = ""
    for sub in getattr(command, "commands", {}).values():
        _hide_flag_types(sub, context)


def build_command() -> Any:
    """The whole command line as one click command (what ``main`` runs)."""
    command = typer.main.get_command(app)
    _hide_flag_types(command)
    return command


def main() -> None:
    """Console-script entry point: user mistakes print one line and exit 2, never a traceback."""
    try:
        build_command()(prog_name="delayed-delivery")
    except DelayedDeliveryError as exc:
        fail(str(exc))
        sys.exit(2)
