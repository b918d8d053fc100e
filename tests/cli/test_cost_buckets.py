"""``cost`` shows the time-bucket row (assumed counts, not yet measured) and the route ``auto`` picks."""

from __future__ import annotations

import pytest

from delayed_delivery.app import cli
from delayed_delivery.cost import estimate_bucket_cost
from tests.cli.conftest import ok_json, run


def test_json_carries_the_bucket_estimate_and_the_auto_route() -> None:
    data = ok_json("cost", "--delay", "30d", "--messages", "1000000")
    assert data["buckets_usd_total"] == pytest.approx(estimate_bucket_cost(30 * 86_400).dollars * 1e6)
    assert data["buckets_usd_total"] < data["our_parked_usd_total"]
    assert data["buckets_counts_measured"] is False and data["buckets_writes_per_message"] == 2
    assert data["auto_route"] == "buckets"
    assert ok_json("cost", "--delay", "10m")["auto_route"] == "native"
    assert ok_json("cost", "--delay", "1d", "--size", "2048")["auto_route"] is None  # parked FIFO not measured


def test_table_labels_the_bucket_row_as_assumed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli.console, "width", 400)  # one line per row
    result = run("cost", "--delay", "365d")
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    assert "assumed counts, not yet measured" in text and "auto picks: buckets" in text
    assert "seed" not in text.lower()
