"""Every benchmark runs at smoke size, so the suite keeps working (figures come from the full runs)."""

from __future__ import annotations

import pytest

from benchmarks.__main__ import discover
from benchmarks.common import Row

#: No emulator needed (``cold_import`` times imports in fresh interpreters).
CORE = ["core_dispatch", "cold_import"]
#: Benchmarks that start their own emulator (Azurite, PostgreSQL). SQS and Spark have their own smoke tests.
SERVICES = ["azure_dispatch", "postgres_mover"]


@pytest.mark.parametrize("name", CORE + SERVICES)
def test_core_benchmarks_run_at_smoke_size(name: str) -> None:
    import importlib

    rows = importlib.import_module(f"benchmarks.{name}").run(smoke=True)
    assert rows and all(isinstance(r, Row) and r.samples for r in rows)
    assert all(v >= 0 for r in rows for v in r.samples)
    assert any(v > 0 for r in rows for v in r.samples)


def test_discovery_finds_the_core_benchmarks() -> None:
    assert set(CORE + SERVICES) <= set(discover())
