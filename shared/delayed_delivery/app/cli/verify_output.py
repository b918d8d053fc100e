"""How ``aws verify`` and ``azure verify`` print a report: a pass/fail table with the evidence, one line per finding
with its fix, the checks that need a real account, the lateness and cost lines, and a summary; or, with ``--json``,
exactly one JSON document on stdout. Progress goes to stderr. Nothing printed is read as markup."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from delayed_delivery.app.cli.output import emit_json, err, one_line, out, print_table, say, styled, visible
from delayed_delivery.verification import Group, Status, VerifyReport

__all__ = ["print_report", "progress_printer"]

_STYLE = {
    Status.PASS: "green",
    Status.FAIL: "bold red",
    Status.WARN: "yellow",
    Status.NEEDS_ACCOUNT: "cyan",
    Status.SKIPPED: "dim",
}
_LABEL = {
    Status.PASS: "pass",
    Status.FAIL: "FAIL",
    Status.WARN: "warn",
    Status.NEEDS_ACCOUNT: "account",
    Status.SKIPPED: "skip",
}


def progress_printer(err: Console) -> Any:
    """A ``Progress`` callback printing one plain line on stderr."""

    def progress(line: str) -> None:
        err.print(Text(visible(f"… {line}")), soft_wrap=True)

    return progress


def _table(report: VerifyReport) -> Table:
    title = Text(visible(f"{report.cloud} verify: {report.target} ({report.mode.value})"))
    table = Table(title=title, title_justify="left")
    for column in ("status", "check", "subject", "evidence"):
        table.add_column(column, overflow="fold")
    for r in report.results:
        table.add_row(
            Text(_LABEL[r.status], style=_STYLE[r.status]),
            Text(r.check),
            Text(visible(r.subject)),
            Text(visible(r.evidence)),
        )
    return table


def _lines(report: VerifyReport) -> list[Text]:
    lines: list[Text] = []
    findings = [r for r in report.results if r.status in (Status.FAIL, Status.WARN)]
    if findings:
        lines.append(Text(f"Findings ({len(findings)}), each with its fix:", style="bold"))
    for r in findings:
        line = Text(f"{_LABEL[r.status]} ", style=_STYLE[r.status])
        line.append(visible(f"{r.check} {r.subject}: {r.evidence} → fix: {r.fix}"))
        lines.append(line)
    for problem in report.cleanup_problems:
        lines.append(Text(visible(f"FAIL clean-up: {problem}"), style="bold red"))
    account = [r for r in report.results if r.status is Status.NEEDS_ACCOUNT]
    if account:
        lines.append(Text(f"Needs a real account ({len(account)}): run without --local to check", style="bold"))
        lines += [Text(visible(f"  {r.check} {r.subject}: {r.evidence}")) for r in account]
    late = [r for r in report.results if "lateness_s" in r.data]
    if late:
        lines.append(
            Text(
                "Lateness (arrival − due, seconds): "
                + ", ".join(f"{r.check.removeprefix('probe-')} {r.data['lateness_s']:+.2f} s" for r in late)
            )
        )
    cost = [r for r in report.results if r.group is Group.COST and r.status is Status.PASS]
    lines += [Text(visible(f"Cost: {r.evidence}")) for r in cost]
    return lines


def _summary(report: VerifyReport) -> Text:
    counts = report.counts()
    said = ", ".join(f"{n} {status}" for status, n in counts.items() if n)
    if report.interrupted:
        return Text(f"interrupted after {said}; everything created was cleaned up — exit 1", style="bold red")
    verdict = "all checks hold" if report.ok else f"{len(report.failures)} check(s) failed"
    return Text(f"{verdict} ({said}) — exit {report.exit_code}", style="bold green" if report.ok else "bold red")


def print_report(report: VerifyReport, *, as_json: bool) -> None:
    """The report on stdout: one JSON document, or the table, the findings and the summary."""
    if report.error is not None:  # nothing was checked: one line on stderr, as for any other error
        err.print(styled("error:", "red", one_line(report.error)), soft_wrap=True)
    if as_json:
        emit_json(report.as_dict())
        return
    if report.error is not None:
        return
    print_table(_table(report), out)
    for line in _lines(report):
        say(line)
    say(_summary(report))
