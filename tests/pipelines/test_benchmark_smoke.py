"""The Spark migration benchmark runs at smoke size (figures come from the full run in benchmarks/spark.md)."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.mark.spark
def test_spark_migrate_benchmark_runs_at_smoke_size(spark: Any) -> None:
    from benchmarks.spark_migrate import run

    rows = run(smoke=True)
    by_metric = {r.metric: r for r in rows}
    assert by_metric["python loop, 1 thread"].median > 0
    assert by_metric["spark local[2]"].median > 0 and by_metric["spark local[2]"].baseline == "python loop"
    assert by_metric["spark local[2] peak RSS (JVM + workers)"].median > by_metric["python loop peak RSS"].median


@pytest.mark.spark
@pytest.mark.azurite
def test_spark_migrate_benchmark_into_its_own_azurite_at_smoke_size(spark: Any) -> None:
    from benchmarks.spark_migrate import measure

    results, _ = measure(1_000, store="azurite", shards=4)
    assert [r["rows"] for r in results] == [1_000, 1_000]
    assert all(float(r["emulator_cpu_seconds"]) > 0 and float(r["cpu_seconds"]) > 0 for r in results)  # type: ignore[arg-type]
