"""Run every benchmark: ``python -m benchmarks [--smoke] [--only NAME]``; prints one table, writes results/all.json.

A full (not smoke) run also rewrites the measured figures ``delayed-delivery cost`` ships with
(``shared/delayed_delivery/data/measured.json``), the ones it measured only.

A benchmark is a module ``benchmarks/<name>.py`` with ``run(smoke: bool = False) -> list[Row]``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import sys
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path

import benchmarks
from benchmarks.common import Row, print_table, write_json
from delayed_delivery.cost import (
    MEASURED_BUCKET_METRICS,
    MEASURED_METRICS,
    MEASURED_TRAFFIC,
    MeasuredFigures,
    bucket_metrics_at,
)

#: The package data ``cost`` reads (a source checkout's copy; an installed wheel carries the one it was built with).
MEASURED = Path(__file__).resolve().parents[1] / "shared" / "delayed_delivery" / "data" / "measured.json"

SKIP = {"common"}


def discover() -> list[str]:
    """Names of benchmark modules."""
    return sorted(m.name for m in pkgutil.iter_modules(benchmarks.__path__) if m.name not in SKIP and not m.ispkg)


def refresh_measured(rows: list[Row], path: Path = MEASURED) -> list[str]:
    """Rewrite the measured figures at ``path`` that ``rows`` hold; returns the names of those replaced."""
    levels = {level: set(bucket_metrics_at(level).values()) for level in MEASURED_TRAFFIC}
    wanted = set(MEASURED_METRICS.values()).union(*levels.values())
    medians = {(r.benchmark, r.metric): r.median for r in rows if (r.benchmark, r.metric) in wanted}
    if not medians:
        return []
    # the traffic each level's counts were measured at: the notes of its rows (aws_costs puts it on the first)
    volumes = {
        level: next((r.notes for r in rows if (r.benchmark, r.metric) in keys and r.notes), "")
        for level, keys in levels.items()
    }
    tier = set(MEASURED_BUCKET_METRICS.values())
    volume = next((r.notes for r in rows if (r.benchmark, r.metric) in tier and r.notes), "")
    current = MeasuredFigures.from_dict(json.loads(path.read_text(encoding="utf-8")))
    figures = current.updated(medians, f"{datetime.now(UTC):%Y-%m-%d} run", volume, volumes)
    path.write_text(json.dumps(figures.as_dict(), indent=2) + "\n", encoding="utf-8")
    names = [name for name, key in MEASURED_METRICS.items() if key in medians]
    return names + (["buckets"] if any(key in medians for key in MEASURED_BUCKET_METRICS.values()) else [])


def main() -> int:
    """Run the selected benchmarks; exit non-zero if any failed."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--smoke", action="store_true", help="tiny sizes, one run each (what CI runs)")
    p.add_argument("--only", action="append", default=[], help="run only these benchmark modules")
    a = p.parse_args()
    rows: list[Row] = []
    failures: list[str] = []
    timings: dict[str, float] = {}
    for name in a.only or discover():
        module = importlib.import_module(f"benchmarks.{name}")
        if not hasattr(module, "run"):
            continue
        print(f"== {name}", file=sys.stderr, flush=True)
        start = time.monotonic()
        try:
            rows.extend(module.run(smoke=a.smoke))
        except Exception:
            failures.append(name)
            traceback.print_exc()
        timings[name] = round(time.monotonic() - start, 1)
    print_table(rows, "delayed-delivery benchmarks" + (" (smoke)" if a.smoke else ""))
    path = write_json("all-smoke" if a.smoke else "all", rows, {"seconds": timings, "failed": failures})
    print(f"wrote {path}")
    if not a.smoke and (refreshed := refresh_measured(rows)):
        print(f"refreshed {', '.join(refreshed)} in {MEASURED}")
    if failures:
        print(f"failed: {', '.join(failures)}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
