"""Benchmark: migrate N synthetic legacy timeouts into SQLite or Azurite, Spark local[2] vs a Python loop.

Both variants do the same work on the same export: read CSV, map each row (``normalize_row``), and
write it with the job's own target: INSERT OR REPLACE into a fresh SQLite store in transactions of
``--batch-size`` messages, or (``--store azurite``) the Azure table target's full entity-group
transactions into a fresh Azurite per variant (one transaction at a time in the loop, ``--in-flight``
per Spark task). Each runs in its own child process; the parent samples the child's process tree
(JVM and Python workers included) every 0.1 s for peak RSS and CPU seconds, and the emulator's CPU
seconds. CPU seconds are the load-independent figure on a shared machine. Prints a table and writes
JSON under ``benchmarks/results/``.

    .venv/bin/python benchmarks/spark_migrate.py --rows 1000000      # the documented full run
    .venv/bin/python benchmarks/spark_migrate.py --rows 2000          # smoke size (used by the tests)
    .venv/bin/python benchmarks/spark_migrate.py --rows 100000 --store azurite   # into Azurite (started here)
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


_TICK = os.sysconf("SC_CLK_TCK")


def _tree(pid: int) -> list[int]:
    """``pid`` and all its live descendants (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(proc.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process so far (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _run_child(argv: list[str], also: int | None = None) -> dict[str, object]:
    """Run one variant; sample its process tree every 0.1 s for peak RSS and CPU seconds (per pid, last seen).

    ``also`` is another process (the emulator) whose CPU seconds during the variant are reported too.
    """
    with tempfile.NamedTemporaryFile("r", suffix=".json") as result:
        also_cpu0 = _cpu_seconds(also) if also else 0.0
        proc = subprocess.Popen([*argv, "--result", result.name], cwd=ROOT)
        peak, cpu = 0, dict[int, float]()
        also_cpu = also_cpu0
        while proc.poll() is None:
            pids = _tree(proc.pid)
            peak = max(peak, sum(_rss_kib(p) for p in pids))
            for p in pids:
                cpu[p] = max(cpu.get(p, 0.0), _cpu_seconds(p))
            if also:
                also_cpu = _cpu_seconds(also)
            time.sleep(0.1)
        if proc.returncode != 0:
            raise SystemExit(f"benchmark child failed ({proc.returncode}): {' '.join(argv)}")
        data: dict[str, object] = json.loads(Path(result.name).read_text())
    data["peak_rss_mib"] = round(peak / 1024, 1)
    data["cpu_seconds"] = round(sum(cpu.values()), 1)
    if also:
        data["emulator_cpu_seconds"] = round(also_cpu - also_cpu0, 1)
    return data


def _python_loop(source: Path, target_url: str, batch_size: int) -> dict[str, object]:
    from delayed_delivery.pipelines.migrate.load import to_message  # the same row → message mapping as Spark
    from delayed_delivery.pipelines.schema import ColumnMapping, LegacyShape, NormalizedRow, normalize_row
    from delayed_delivery.pipelines.targets import TargetSpec

    files = sorted(source.glob("*.csv"))
    with files[0].open(newline="") as fh:
        columns = next(csv.reader(fh))
    mapping = ColumnMapping.for_columns(LegacyShape.TIMEOUT_MANAGER, columns)
    target = TargetSpec.parse(target_url).build()
    target.prepare()
    start = time.perf_counter()
    written = rejected = 0
    chunk = []
    for path in files:
        with path.open(newline="", encoding="utf-8") as fh:
            for row in csv.DictReader(fh):
                result = normalize_row(row, mapping)
                if not isinstance(result, NormalizedRow):
                    rejected += 1
                    continue
                chunk.append(to_message(_as_row(result)))
                if len(chunk) >= batch_size:
                    target.write(chunk)
                    written += len(chunk)
                    chunk = []
    if chunk:
        target.write(chunk)
        written += len(chunk)
    target.flush()
    target.close()
    seconds = time.perf_counter() - start
    return {"variant": "python loop (1 thread)", "rows": written, "rejected": rejected, "seconds": seconds}


def _as_row(n: object) -> dict[str, object]:
    return {f: getattr(n, f) for f in ("message_id", "destination", "body", "due_us", "headers_json", "failure_count")}


def _spark(source: Path, target_url: str, batch_size: int, master: str, workdir: Path) -> dict[str, object]:
    from delayed_delivery.pipelines.migrate import MigrationOptions, run_migration
    from delayed_delivery.pipelines.session import get_session

    t0 = time.perf_counter()
    spark = get_session(master, "delayed-delivery-benchmark")
    startup = time.perf_counter() - t0
    out = workdir / "spark-out"
    opts = MigrationOptions(source=str(source), target=target_url, batches=16)
    summary = run_migration(spark, opts, str(out), batch_size=batch_size)
    spark.stop()
    return {
        "variant": f"spark {master}",
        "rows": summary.rows_written,
        "rejected": summary.rejected,
        "seconds": summary.seconds,
        "session_startup_seconds": startup,
    }


def measure(
    rows: int,
    batch_size: int = 1000,
    master: str = "local[2]",
    files: int = 8,
    workdir: str | None = None,
    store: str = "sqlite",
    shards: int = 256,
    in_flight: int = 4,
) -> tuple[list[dict[str, object]], float]:
    """Generate the export, run both variants in child processes; their results and the generation time."""
    from delayed_delivery.pipelines.schema import LegacyShape
    from delayed_delivery.pipelines.synthetic import write_legacy_export

    work = Path(workdir or tempfile.mkdtemp(prefix="dd-bench-"))
    t0 = time.perf_counter()
    export = write_legacy_export(work / "export", LegacyShape.TIMEOUT_MANAGER, rows, seed=42, files=files)
    gen_seconds = time.perf_counter() - t0
    me = [sys.executable, str(Path(__file__).resolve()), "--batch-size", str(batch_size), "--master", master]
    azurite = None
    if store == "azurite":
        sys.path.insert(0, str(ROOT))
        from delayed_delivery.pipelines.targets import DEFAULT_AZURE_CONNECTION_ENV
        from tests.fixtures.azurite import start_azurite

        azurite = start_azurite()
        os.environ[DEFAULT_AZURE_CONNECTION_ENV] = azurite.connection_string
    results = []
    try:
        for variant in ("python", "spark"):
            if store == "azurite":  # one transaction at a time in the loop; several per Spark task
                url = f"azure-table:bench{variant}{os.getpid()}?shards={shards}"
                url += f"&in_flight={1 if variant == 'python' else in_flight}"
            else:
                db = work / f"{variant}.db"
                db.unlink(missing_ok=True)
                url = f"sqlite:{db}"
            emulator = azurite.process.proc.pid if azurite is not None and azurite.process.proc else None
            res = _run_child([*me, "--variant", variant, "--source", export.path, "--target-url", url,
                              "--workdir", str(work / variant)], also=emulator)  # fmt: skip
            res["rows_per_second"] = round(float(res["rows"]) / float(res["seconds"]), 1)  # type: ignore[arg-type]
            results.append(res)
            if (
                azurite is not None and variant == "python"
            ):  # a fresh emulator per variant: Azurite slows down as its tables grow
                azurite.process.stop()
                azurite = start_azurite()
                os.environ[DEFAULT_AZURE_CONNECTION_ENV] = azurite.connection_string
    finally:
        if azurite is not None:
            azurite.process.stop()
    if results[0]["rows"] != results[1]["rows"]:
        raise SystemExit(f"the variants wrote different row counts: {results[0]['rows']} vs {results[1]['rows']}")
    return results, gen_seconds


def run(smoke: bool = False) -> list[Any]:
    """Runner hook (``python -m benchmarks``): rows/s and peak RSS for both variants (2,000 rows when smoke)."""
    from benchmarks.common import Row

    size = 2_000 if smoke else 1_000_000
    results, _ = measure(size)
    py, sp = results
    name = f"spark_migrate ({size:,} rows → SQLite)"
    return [
        Row(name, "python loop, 1 thread", "rows/s", (float(py["rows_per_second"]),)),  # type: ignore[arg-type]
        Row(
            name,
            f"{sp['variant']}",
            "rows/s",
            (float(sp["rows_per_second"]),),  # type: ignore[arg-type]
            baseline="python loop",
            ratio_to_baseline=float(sp["rows_per_second"]) / float(py["rows_per_second"]),  # type: ignore[arg-type]
        ),
        Row(name, "python loop peak RSS", "MiB", (float(py["peak_rss_mib"]),)),  # type: ignore[arg-type]
        Row(name, f"{sp['variant']} peak RSS (JVM + workers)", "MiB", (float(sp["peak_rss_mib"]),)),  # type: ignore[arg-type]
    ]


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--workdir", default=None, help="Where to put the export and stores (default: a temp dir).")
    ap.add_argument("--results", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--variant", choices=("python", "spark"), help=argparse.SUPPRESS)
    ap.add_argument("--source", help=argparse.SUPPRESS)
    ap.add_argument("--store", choices=("sqlite", "azurite"), default="sqlite", help="Target store.")
    ap.add_argument("--shards", type=int, default=256, help="Azure table shards (partitions).")
    ap.add_argument("--in-flight", type=int, default=4, help="Azure transactions in flight per Spark task.")
    ap.add_argument("--target-url", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    return ap


def _print_results(a: argparse.Namespace, results: list[dict[str, object]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Migrating {a.rows:,} synthetic timeouts into {a.store} ({os.cpu_count()} CPUs)")
    for col in ("variant", "rows", "seconds", "rows/s", "peak RSS (MiB)", "CPU s (tree)", "emulator CPU s"):
        table.add_column(col, justify="left" if col == "variant" else "right")
    for r in results:
        table.add_row(
            str(r["variant"]),
            f"{r['rows']:,}",
            f"{float(r['seconds']):.1f}",  # type: ignore[arg-type]
            f"{r['rows_per_second']:,.0f}",
            f"{r['peak_rss_mib']:,}",
            f"{r['cpu_seconds']}",
            f"{r.get('emulator_cpu_seconds', '-')}",
        )
    Console().print(table)


def _write_results(a: argparse.Namespace, results: list[dict[str, object]], gen_seconds: float) -> Path:
    report = {
        "benchmark": "spark_migrate",
        "at": datetime.now(UTC).isoformat(),
        "rows": a.rows,
        "store": a.store,
        "batch_size": a.batch_size,
        "shards": a.shards if a.store == "azurite" else None,
        "in_flight": a.in_flight if a.store == "azurite" else None,
        "generate_seconds": round(gen_seconds, 1),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "results": results,
        "command": " ".join(["benchmarks/spark_migrate.py", *sys.argv[1:]]),
    }
    results_dir = Path(a.results)
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"spark_migrate-{a.store}-{a.rows}.json"
    path.write_text(json.dumps(report, indent=1))
    return path


def main() -> None:
    """Parse arguments; as parent generate data and run both children, as child run one variant."""
    a = _parser().parse_args()
    if a.variant:
        source, url = Path(a.source), a.target_url
        data = (
            _python_loop(source, url, a.batch_size)
            if a.variant == "python"
            else _spark(source, url, a.batch_size, a.master, Path(a.workdir))
        )
        Path(a.result).write_text(json.dumps(data))
        return
    results, gen_seconds = measure(
        a.rows, a.batch_size, a.master, a.files, a.workdir, a.store, shards=a.shards, in_flight=a.in_flight
    )
    _print_results(a, results)
    print(f"written {_write_results(a, results, gen_seconds)}")


if __name__ == "__main__":
    main()
