"""Shared benchmark helpers: timing with medians over repeated runs, machine info, table and JSON output."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True, slots=True)
class Row:
    """One measured figure: the median of ``samples`` plus min/max, with an optional baseline ratio."""

    benchmark: str
    metric: str
    unit: str
    samples: tuple[float, ...]
    baseline: str | None = None
    ratio_to_baseline: float | None = None
    notes: str = ""

    @property
    def median(self) -> float:
        """Median of the samples."""
        return statistics.median(self.samples)

    def as_dict(self) -> dict[str, object]:
        """JSON-friendly form with the median, min and max spelled out."""
        d = asdict(self)
        d.update(median=self.median, min=min(self.samples), max=max(self.samples), runs=len(self.samples))
        return d


@dataclass(slots=True)
class Timer:
    """Collects durations of repeated runs."""

    seconds: list[float] = field(default_factory=list)

    def measure(self, fn: Callable[[], object]) -> object:
        """Run ``fn`` once and record how long it took."""
        start = time.perf_counter()
        out = fn()
        self.seconds.append(time.perf_counter() - start)
        return out


def machine() -> dict[str, object]:
    """What the figures were measured on."""
    mem = 0
    try:
        with Path("/proc/meminfo").open() as f:
            mem = int(f.readline().split()[1]) // 1024
    except OSError:
        pass
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "memory_mib": mem,
        "processor": platform.processor() or platform.machine(),
    }


def rss_mib() -> float:
    """Current resident set size of this process in MiB."""
    try:
        with Path("/proc/self/status").open() as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def write_json(name: str, rows: list[Row], extra: dict[str, object] | None = None) -> Path:
    """Write ``benchmarks/results/<name>.json`` and return its path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = {
        "machine": machine(),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rows": [r.as_dict() for r in rows],
        **(extra or {}),
    }
    path.write_text(json.dumps(payload, indent=2))
    return path


def ratio(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    """Median of ``a`` over median of ``b``."""
    return statistics.median(a) / statistics.median(b)


def print_table(rows: list[Row], title: str = "benchmarks") -> None:
    """Print rows as a rich table."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in ("benchmark", "metric", "median", "min", "max", "runs", "vs baseline"):
        table.add_column(col, justify="right" if col not in ("benchmark", "metric") else "left")
    for r in rows:
        ratio = f"{r.ratio_to_baseline:.2f}× {r.baseline}" if r.ratio_to_baseline is not None else ""
        table.add_row(
            r.benchmark,
            f"{r.metric} ({r.unit})",
            f"{r.median:,.3f}",
            f"{min(r.samples):,.3f}",
            f"{max(r.samples):,.3f}",
            str(len(r.samples)),
            ratio,
        )
    Console(width=200).print(table)
