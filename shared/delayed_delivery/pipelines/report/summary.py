"""The report's summary, as Markdown (``summary.md``) and as one HTML page with the charts inside (``summary.html``).

Both come from one list of sections, so they say the same things. Every value from the logs (endpoints, reasons)
is escaped in the HTML; the charts are embedded as ``data:`` images, so the page is one file that opens anywhere.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Section", "markdown", "page", "sections"]


@dataclass(frozen=True, slots=True)
class Section:
    """A heading, an optional sentence, an optional table (by name) and an optional chart (by file stem)."""

    heading: str
    table: str | None = None
    chart: str | None = None
    text: str = ""


def sections() -> list[Section]:
    """The report's sections, in order."""
    return [
        Section("Lateness by endpoint", "lateness_by_endpoint"),
        Section("Lateness by delay band", "lateness_by_band", "lateness_by_band"),
        Section("Duplicate deliveries", "duplicates"),
        Section("Hops per message (SQS FIFO cycles; full distribution in hops.csv)", "hops_by_band", "hops"),
        Section("Error-queue forwards", "error_queue"),
        Section("Throughput (handed to the destination per minute)", None, "throughput"),
        Section(
            "SQS requests and cost per message by delay band (measured vs the NServiceBus formula)",
            "cost_by_band",
            "cost_by_band",
            "The NServiceBus formula: delay / 900 × 2 requests × $0.50 per million. "
            "Measured: logged requests, or 2 per hop + 1.",
        ),
        Section("End-to-end lateness at the consumer by endpoint (received − due)", "consumer_lateness_by_endpoint"),
        Section("End-to-end lateness at the consumer by delay band", "consumer_lateness_by_band"),
    ]


def fmt(value: Any) -> str:
    """A table cell: ``-`` for none, floats to 3 decimals (or 3 significant digits when tiny)."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 0.001 and value else f"{value:,.3f}"
    return str(value)


def _headline(tables: dict[str, list[dict[str, Any]]], counts: tuple[int, int, int]) -> str:
    lines, events, messages = counts
    dup = sum(int(r["duplicate_deliveries"] or 0) for r in tables["duplicates"])
    errq = sum(int(r["forwards"]) for r in tables["error_queue"])
    return (
        f"{lines:,} log lines, {events:,} events, {messages:,} messages; {dup:,} duplicate deliveries; "
        f"{errq:,} error-queue forwards. Percentiles are nearest-rank; lateness in seconds."
    )


def _drawn(charts: Sequence[str]) -> dict[str, str]:
    return {Path(c).stem: c for c in charts}


def _md_table(rows: Sequence[dict[str, Any]]) -> str:
    if not rows:
        return "_none_\n"
    cols = list(rows[0])
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(fmt(r[c]).replace("|", "\\|") for c in cols) + " |" for r in rows]
    return "\n".join(out) + "\n"


def markdown(
    tables: dict[str, list[dict[str, Any]]], counts: tuple[int, int, int], notes: Sequence[str], charts: Sequence[str]
) -> str:
    """``summary.md``: the headline, the notes, then each section's table and chart."""
    drawn = _drawn(charts)
    parts = ["# Delayed delivery report\n", _headline(tables, counts) + "\n", "".join(f"* {n}\n" for n in notes)]
    for section in sections():
        parts.append(f"## {section.heading}\n")
        if section.text:
            parts.append(section.text + "\n")
        if section.table is not None:
            parts.append(_md_table(tables[section.table]))
        if section.chart in drawn:
            parts.append(f"![{section.chart}]({section.chart}.png)\n")
        elif section.table is None:
            parts.append("_none_\n")
    return "\n".join(part for part in parts if part)


_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; color: #1b1f24; margin: 0 auto; max-width: 1180px; padding: 16px 24px; }
h1 { font-size: 22px; margin: 8px 0; } h2 { font-size: 16px; margin: 18px 0 6px; }
.notes { color: #444; padding-left: 18px; }
.grid { display: grid; grid-template-columns: minmax(0, 1fr) minmax(0, 1fr); gap: 12px 24px; }
section { break-inside: avoid; min-width: 0; }
img { display: block; max-width: 100%; height: auto; border: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 12px; margin: 4px 0; }
td, th { border: 1px solid #ccc; padding: 2px 6px; }
th { background: #f0f3f6; } td.n { text-align: right; font-variant-numeric: tabular-nums; } .none { color: #777; }
"""


def _html_table(rows: Sequence[dict[str, Any]]) -> str:
    if not rows:
        return '<p class="none">none</p>'
    cols = list(rows[0])
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="n">{html.escape(fmt(r[c]))}</td>'
            if isinstance(r[c], int | float)
            else f"<td>{html.escape(fmt(r[c]))}</td>"
            for c in cols
        )
        + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _image(path: str, alt: str) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def page(
    tables: dict[str, list[dict[str, Any]]], counts: tuple[int, int, int], notes: Sequence[str], charts: Sequence[str]
) -> str:
    """``summary.html``: one page, the charts embedded, two columns of sections."""
    drawn = _drawn(charts)
    blocks = []
    for section in sections():
        inner = [f"<h2>{html.escape(section.heading)}</h2>"]
        if section.text:
            inner.append(f"<p>{html.escape(section.text)}</p>")
        if section.chart in drawn:
            inner.append(_image(drawn[section.chart], section.heading))
        if section.table is not None:
            inner.append(_html_table(tables[section.table]))
        elif section.chart not in drawn:
            inner.append('<p class="none">none</p>')
        blocks.append("<section>" + "".join(inner) + "</section>")
    note_items = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>Delayed delivery report</title><style>{_STYLE}</style></head><body>"
        f"<h1>Delayed delivery report</h1><p>{html.escape(_headline(tables, counts))}</p>"
        f'<ul class="notes">{note_items}</ul><div class="grid">{"".join(blocks)}</div></body></html>\n'
    )
