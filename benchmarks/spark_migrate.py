"""Benchmark: migrate N synthetic legacy timeouts into SQLite, Azurite or the S3 tier, Spark local[2] vs a loop.

Both variants do the same work on the same export: read CSV, map each row (``normalize_row``), and
write it with the job's own target: INSERT OR REPLACE into a fresh SQLite store in transactions of
``--batch-size`` messages, or (``--store azurite``) the Azure table target's full entity-group
transactions into a fresh Azurite per variant (one transaction at a time in the loop, ``--in-flight``
per Spark task), or (``--store s3buckets``) the S3 time-bucket tier's target on a fresh moto server per
variant: the loop holds every message, sorts them bucket after bucket as the job does, and writes one
object per bucket with the same ``BucketTarget``. Each runs in its own child process; the parent
samples the child's process tree (JVM and Python workers included) every 0.1 s for peak RSS and CPU
seconds, and the emulator's CPU seconds. CPU seconds are the load-independent figure on a shared
machine. Prints a table and writes JSON under ``benchmarks/results/``.

    .venv/bin/python benchmarks/spark_migrate.py --rows 1000000      # the documented full run
    .venv/bin/python benchmarks/spark_migrate.py --rows 2000          # smoke size (used by the tests)
    .venv/bin/python benchmarks/spark_migrate.py --rows 100000 --store azurite   # into Azurite (started here)
    .venv/bin/python -m benchmarks.spark_migrate --rows 1000000 --store s3buckets   # the tier on moto S3
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
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: The S3 bucket each ``--store s3buckets`` variant writes into (on its own fresh moto server).
_S3_BUCKET = "delayed-delivery-migrate-bench"


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
    spec = TargetSpec.parse(target_url)
    target = spec.build()
    target.prepare()
    start = time.perf_counter()
    grouped = spec.scheme == "s3buckets"  # the tier's grouping: every message first, then bucket after bucket
    pending: list[Any] = []
    rejected = written = refused = 0
    for path in files:
        with path.open(newline="", encoding="utf-8") as fh:
            for row in csv.DictReader(fh):
                result = normalize_row(row, mapping)
                if not isinstance(result, NormalizedRow):
                    rejected += 1
                    continue
                pending.append(to_message(_as_row(result)))
                if not grouped and len(pending) >= batch_size:
                    refused += len(target.write(pending))
                    written, pending = written + len(pending), []
    if grouped:  # the job's order: the fine period of the due time, then the id
        fine = _fine_seconds(spec)
        pending.sort(key=lambda m: (int(m.due_at.timestamp()) // fine, m.message_id))
    for at in range(0, len(pending), batch_size):
        refused += len(target.write(pending[at : at + batch_size]))
    written += len(pending)
    target.flush()
    target.close()
    seconds = time.perf_counter() - start
    variant = "python loop (1 thread)"
    return {"variant": variant, "rows": written - refused, "rejected": rejected, "seconds": seconds}


def _fine_seconds(spec: Any) -> int:
    from delayed_delivery.pipelines.bucket_target import bucket_levels

    return bucket_levels(spec).fine_seconds


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


@contextmanager
def _sink(store: str, variant: str, work: Path, shards: int, in_flight: int) -> Iterator[tuple[str, int | None]]:
    """A fresh target per variant: its URL and the emulator's pid (None for SQLite); the emulator stops after."""
    if store == "sqlite":
        db = work / f"{variant}.db"
        db.unlink(missing_ok=True)
        yield f"sqlite:{db}", None
        return
    from delayed_delivery.app.emulators import LocalEmulators

    if store == "azurite":  # one transaction at a time in the loop; several per Spark task
        from delayed_delivery.pipelines.targets import DEFAULT_AZURE_CONNECTION_ENV

        with LocalEmulators(moto=False) as azurite:  # fresh per variant: Azurite slows down as its tables grow
            os.environ[DEFAULT_AZURE_CONNECTION_ENV] = azurite.azure_connection_string
            flight = 1 if variant == "python" else in_flight
            url = f"azure-table:bench{variant}{os.getpid()}?shards={shards}&in_flight={flight}"
            node = azurite.emulators["azurite"].process
            yield url, node.pid if node else None
        return
    import boto3

    from delayed_delivery.pipelines.bucket_target import bucket_target_url

    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
        os.environ.setdefault(name, value)
    with LocalEmulators(azurite=False) as emulators:  # a fresh moto server per variant
        endpoint = emulators.sqs_endpoint
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=_S3_BUCKET)
        process = emulators.emulators["moto"].process
        yield bucket_target_url(_S3_BUCKET, None, endpoint, "us-east-1"), process.pid if process else None


def _tier_objects(url: str) -> dict[str, int]:
    """Objects and messages in the tier's S3 bucket, from the listing (keys carry the count)."""
    import boto3

    from delayed_delivery.aws.tier.store import S3BucketStore
    from delayed_delivery.pipelines.targets import TargetSpec
    from delayed_delivery.timebuckets.wheel import COARSE, FINE

    spec = TargetSpec.parse(url)
    client = boto3.client("s3", endpoint_url=spec.option("endpoint_url"), region_name="us-east-1")
    store = S3BucketStore(client, spec.location)
    listed = [o for level in (FINE, COARSE) for o in store.objects(level)]
    buckets = {o.bucket for o in listed}
    counts = {"objects": len(listed), "buckets": len(buckets), "messages": sum(o.count or 0 for o in listed)}
    return counts | {f"{level}_objects": sum(o.bucket.level == level for o in listed) for level in (FINE, COARSE)}


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
    # The tier buckets against the real clock: due times around now, so 1 % are already due as with the other stores.
    now = {"now": datetime.now(UTC)} if store == "s3buckets" else {}
    export = write_legacy_export(work / "export", LegacyShape.TIMEOUT_MANAGER, rows, seed=42, files=files, **now)
    gen_seconds = time.perf_counter() - t0
    me = [sys.executable, str(Path(__file__).resolve()), "--batch-size", str(batch_size), "--master", master]
    results = []
    for variant in ("python", "spark"):
        with _sink(store, variant, work, shards, in_flight) as (url, emulator):
            res = _run_child([*me, "--variant", variant, "--source", export.path, "--target-url", url,
                              "--workdir", str(work / variant)], also=emulator)  # fmt: skip
            if store == "s3buckets":
                res["tier"] = _tier_objects(url)
        res["rows_per_second"] = round(float(res["rows"]) / float(res["seconds"]), 1)  # type: ignore[arg-type]
        results.append(res)
    if results[0]["rows"] != results[1]["rows"] or results[0].get("tier", {}).get("messages") != results[1].get(
        "tier", {}
    ).get("messages"):
        raise SystemExit(f"the variants wrote different counts: {results[0]} vs {results[1]}")
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
    ap.add_argument(
        "--store",
        choices=("sqlite", "azurite", "s3buckets"),
        default="sqlite",
        help="Target: SQLite, Azurite's table, or the S3 time-bucket tier on moto S3 (each started here).",
    )
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
    python, spark = results
    print(f"spark / loop: {float(spark['rows_per_second']) / float(python['rows_per_second']):.2f}x")  # type: ignore[arg-type]
    for r in results:
        if "tier" in r:
            print(f"{r['variant']}: {r['tier']} in the tier's S3 bucket")


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
        "spark_to_loop": round(float(results[1]["rows_per_second"]) / float(results[0]["rows_per_second"]), 2),  # type: ignore[arg-type]
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
