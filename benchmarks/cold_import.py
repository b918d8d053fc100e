"""Cold import time of the function entry points against importing their cloud SDK alone, each in a fresh interpreter.

A Lambda or Functions cold start pays for every module the entry point imports before the first event. Each
sample is one new ``python`` process that times one ``import`` statement with ``time.perf_counter`` (interpreter
start-up, the same for both sides, is left out). Sides alternate (A, B, A, B, ...) so a busy machine slows both
alike; one untimed warm-up of each writes the ``.pyc`` files first. Median, min and max of the runs.

* ``aws_requeue_handler_import``: ``import functions.aws.requeue`` against ``import boto3`` (target ≤ 1.5×).
* ``azure_function_app_import``: ``import functions.azure.function_app`` against importing the Azure SDK
  packages the app uses (``azure.functions``, ``azure.data.tables``, ``azure.storage.queue``, ``azure.storage.blob``).

Run: ``python -m benchmarks.cold_import [--smoke] [--runs 9]``. Figures: benchmarks/aws.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.common import Row, print_table, write_json

NAME = "cold_import"
ROOT = Path(__file__).resolve().parent.parent

#: (metric, entry-point import, baseline label, baseline import)
PAIRS: tuple[tuple[str, str, str, str], ...] = (
    ("aws_requeue_handler_import", "import functions.aws.requeue", "import boto3", "import boto3"),
    (
        "azure_function_app_import",
        "import functions.azure.function_app",
        "Azure SDK imports",
        "import azure.functions, azure.data.tables, azure.storage.queue, azure.storage.blob",
    ),
)

_PROBE = "import time\nt = time.perf_counter()\n{statement}\nprint(time.perf_counter() - t)\n"


def time_import(statement: str) -> float:
    """Seconds one fresh interpreter spends on ``statement`` (from the repository root, ``.pyc`` files allowed)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("POWERTOOLS_") and k != "PYTHONDONTWRITEBYTECODE"}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE.format(statement=statement)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return float(out.stdout.strip().splitlines()[-1])


def measure(statement: str, baseline: str, runs: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Alternating samples of ``statement`` and ``baseline`` after one untimed warm-up of each."""
    time_import(statement)
    time_import(baseline)
    mine: list[float] = []
    base: list[float] = []
    for _ in range(runs):
        mine.append(time_import(statement))
        base.append(time_import(baseline))
    return tuple(mine), tuple(base)


def run(smoke: bool = False, *, runs: int = 9) -> list[Row]:
    """The benchmark-runner entry point: one row per entry point (seconds, ratio to its SDK baseline)."""
    runs = 1 if smoke else max(5, runs)  # smoke: one pair after the warm-up pair
    rows: list[Row] = []
    for metric, statement, label, baseline in PAIRS:
        mine, base = measure(statement, baseline, runs)
        rows.append(
            Row(
                NAME,
                metric,
                "s",
                mine,
                label,
                statistics.median(mine) / statistics.median(base),
                f"`{statement}` in a fresh interpreter, {runs} runs alternating with `{baseline}`",
            )
        )
        rows.append(Row(NAME, f"{metric}_baseline", "s", base, notes=f"`{baseline}` alone"))
    return rows


def main() -> None:
    """Command line: print the table and write ``benchmarks/results/cold_import.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--runs", type=int, default=9)
    a = parser.parse_args()
    rows = run(a.smoke, runs=a.runs)
    print_table(rows, "cold import time (fresh interpreter per sample)")
    print(write_json(NAME + ("-smoke" if a.smoke else ""), rows))


if __name__ == "__main__":
    main()
