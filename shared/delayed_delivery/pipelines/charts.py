"""PNG charts with matplotlib's Agg backend (no display needed), with honest axes.

Counts get whole-number ticks from zero; per-minute data is drawn as bars, one per minute, with the minutes that
had none at zero (never a line between two points); a log axis shows plain numbers (1, 10, 100), not 10⁰; a legend
names only series that have a bar on the chart (a log axis cannot draw zero, so such a series is left out and said).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

__all__ = ["bar_chart", "count_bar_chart", "grouped_bar_chart", "minute_bar_chart"]

#: Per-minute bars for at most this many minutes; a longer span is drawn per hour.
MAX_MINUTE_BARS = 24 * 60
_COLOR = "#3b6ea5"


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _whole_counts(axis: Any) -> None:
    """Whole-number ticks (counts are never 2.5), plain numbers."""
    from matplotlib.ticker import MaxNLocator, ScalarFormatter

    axis.set_major_locator(MaxNLocator(integer=True))
    axis.set_major_formatter(ScalarFormatter(useOffset=False))


def _save(fig: Any, plt: Any, path: str) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def bar_chart(
    path: str,
    xs: Sequence[datetime] | Sequence[str],
    heights: Sequence[float],
    *,
    title: str,
    ylabel: str,
    width_days: float | None = None,
) -> str:
    """Write a bar chart (time or category on x) to ``path``."""
    plt = _pyplot()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    if width_days is not None:
        ax.bar(list(xs), list(heights), width=width_days, align="edge", color=_COLOR)
        fig.autofmt_xdate()
    else:
        ax.bar([str(x) for x in xs], list(heights), color=_COLOR)
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, plt, path)


def grouped_bar_chart(
    path: str,
    categories: Sequence[str],
    series: dict[str, Sequence[float]],
    *,
    title: str,
    ylabel: str,
    log: bool = False,
) -> str:
    """Write a grouped bar chart: one group per category, one bar per series; the legend names what is drawn.

    On a log axis a zero cannot be drawn: a series with nothing above zero is left out (the title says so), and a
    zero bar of another series is simply absent.
    """
    plt = _pyplot()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    drawn = {k: list(v) for k, v in series.items() if not log or any(x > 0 for x in v)}
    left_out = [k for k in series if k not in drawn]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    n = max(1, len(drawn))
    width = 0.8 / n
    for i, (name, values) in enumerate(drawn.items()):
        shown = [v if v > 0 else float("nan") for v in values] if log else values
        ax.bar([j + i * width for j in range(len(categories))], shown, width=width, label=name)
    ax.set_xticks([j + width * (n - 1) / 2 for j in range(len(categories))], list(categories))
    if log and drawn:
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))  # 0.001, not 10⁻³
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_title(title + (f" (no {', '.join(left_out)} above zero to draw)" if left_out else ""))
    ax.set_ylabel(ylabel)
    if drawn:
        ax.legend()
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, plt, path)


def minute_bar_chart(path: str, minutes: Sequence[datetime], counts: Sequence[int], *, title: str, ylabel: str) -> str:
    """Write one bar per minute from the first to the last (minutes without any at zero); per hour beyond a day."""
    plt = _pyplot()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    by_minute: dict[datetime, int] = {}
    for minute, count in zip(minutes, counts, strict=True):
        start = minute.replace(second=0, microsecond=0)
        by_minute[start] = by_minute.get(start, 0) + int(count)
    first, last = min(by_minute), max(by_minute)
    step = timedelta(minutes=1)
    if (last - first) / step > MAX_MINUTE_BARS:
        step = timedelta(hours=1)
        first = first.replace(minute=0)
        ylabel = ylabel.replace("minute", "hour")
        title = title.replace("per minute", "per hour")
    slots: dict[datetime, int] = {}
    at = first
    while at <= last:
        slots[at] = 0
        at += step
    for minute, count in by_minute.items():
        slot = minute if step == timedelta(minutes=1) else minute.replace(minute=0)
        slots[slot] = slots.get(slot, 0) + count
    fig, ax = plt.subplots(figsize=(9, 4.5))
    import matplotlib.dates as mdates

    ax.bar(list(slots), list(slots.values()), width=step * 0.9, align="edge", color=_COLOR)
    pattern = "%H:%M" if last - first < timedelta(days=1) else "%m-%d %H:%M"
    ax.xaxis.set_major_formatter(mdates.DateFormatter(pattern))  # type: ignore[no-untyped-call]
    _whole_counts(ax.yaxis)
    ax.set_ylim(bottom=0)
    fig.autofmt_xdate()
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, plt, path)


def count_bar_chart(path: str, xs: Sequence[int], ys: Sequence[int], *, title: str, xlabel: str, ylabel: str) -> str:
    """Write counts over a whole-number x (e.g. messages per hop count): bars, whole-number ticks on both axes;
    beyond 60 the x axis is symmetric-log with plain labels (0, 1, 10, 100), so 0 stays on it."""
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    plt = _pyplot()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    wide = max(xs, default=0) > 60
    if wide:
        ax.vlines(list(xs), 0, list(ys), color=_COLOR, linewidth=4)
        ax.set_xscale("symlog", linthresh=1)
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
        xlabel += " (symmetric log scale)"
    else:
        ax.bar(list(xs), list(ys), width=0.8, color=_COLOR)
        _whole_counts(ax.xaxis)
        ax.set_xlim(min(xs, default=0) - 0.6, max(xs, default=0) + 0.6)  # no tick below the smallest count
    _whole_counts(ax.yaxis)
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, plt, path)
