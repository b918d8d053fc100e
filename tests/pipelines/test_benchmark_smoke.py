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
