"""PNG charts with matplotlib's Agg backend (no display needed)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

__all__ = ["bar_chart", "grouped_bar_chart", "line_chart", "scatter_chart"]


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


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
        ax.bar(list(xs), list(heights), width=width_days, align="edge", color="#3b6ea5")
        fig.autofmt_xdate()
    else:
        ax.bar([str(x) for x in xs], list(heights), color="#3b6ea5")
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def grouped_bar_chart(
    path: str,
    categories: Sequence[str],
    series: dict[str, Sequence[float]],
    *,
    title: str,
    ylabel: str,
    log: bool = False,
) -> str:
    """Write a grouped bar chart: one group per category, one bar per series."""
    plt = _pyplot()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    n = max(1, len(series))
    width = 0.8 / n
    for i, (name, values) in enumerate(series.items()):
        ax.bar([j + i * width for j in range(len(categories))], list(values), width=width, label=name)
    ax.set_xticks([j + width * (n - 1) / 2 for j in range(len(categories))], list(categories))
    if log:
        ax.set_yscale("log")
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def line_chart(path: str, xs: Sequence[datetime], ys: Sequence[float], *, title: str, ylabel: str) -> str:
    """Write a line chart over time."""
    plt = _pyplot()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.plot(list(xs), list(ys), marker="." if len(xs) < 60 else None, color="#3b6ea5")
    fig.autofmt_xdate()
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def scatter_chart(path: str, xs: Sequence[float], ys: Sequence[float], *, title: str, xlabel: str, ylabel: str) -> str:
    """Write a stem-style chart of counts over a numeric x (log x when it spans decades)."""
    plt = _pyplot()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.vlines([x + 1 for x in xs], 0, list(ys), color="#3b6ea5", linewidth=3)
    ax.set_xscale("log")
    ax.set_title(title)
    ax.set_xlabel(xlabel.replace("(log)", "+ 1 (log)"))
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
