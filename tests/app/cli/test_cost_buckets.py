"""``cost`` shows the time-bucket row (counted at moto, or labelled assumed) and the route ``auto`` picks."""

from __future__ import annotations

import pytest

from delayed_delivery.cost import choose_long_delay_route, load_measured_figures
from delayed_delivery.timebuckets.cost import estimate_bucket_cost
from tests.app.cli.conftest import ok_json, run


def test_json_carries_the_bucket_estimate_and_the_auto_route() -> None:
    counts = load_measured_figures().bucket_counts()
    data = ok_json("cost", "--delay", "30d", "--messages", "1000000")
    assert data["buckets_usd_total"] == pytest.approx(estimate_bucket_cost(30 * 86_400, counts=counts).dollars * 1e6)
    assert data["buckets_counts_measured"] is counts.measured and data["buckets_writes_per_message"] == 2
    assert data["buckets_counts_source"] == counts.source and data["buckets_fixed_usd_per_month"] > 0
    assert data["auto_route"] == choose_long_delay_route(30 * 86_400) in ("fifo", "buckets")
    assert set(data["auto_route_by_delay"]) == {"1d", "30d", "1y"}
    assert data["auto_route_by_delay"]["1y"] == choose_long_delay_route(365 * 86_400)
    assert ok_json("cost", "--delay", "10m")["auto_route"] == "native"
    assert ok_json("cost", "--delay", "1d", "--size", "2048")["auto_route"] is None  # parked FIFO not measured


def test_table_labels_the_bucket_row_and_names_what_auto_picks() -> None:
    result = run("cost", "--delay", "365d")  # into a pipe: one line per row, however long
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    counts = load_measured_figures().bucket_counts()
    label = f"counted at moto, {counts.volume}" if counts.measured else "assumed counts, not yet measured"
    assert label in text
    assert f"auto picks at 1,000 long-delayed messages a minute: {choose_long_delay_route(365 * 86_400)}" in text
    assert "at 100 a minute:" in text and "10,000 a minute:" in text
    assert "1 KiB at 1 d / 30 d / 1 y:" in text and "a month for the timer" in text
    assert "seed" not in text.lower()


def test_the_traffic_given_prices_the_tier_and_says_what_auto_picks_at_it(monkeypatch: pytest.MonkeyPatch) -> None:
    figures = load_measured_figures()
    data = ok_json("cost", "--delay", "30d", "--per-minute", "100")
    counts = figures.bucket_counts(100)
    assert data["auto_traffic_per_minute"] == 100
    assert data["buckets_usd_total"] == pytest.approx(estimate_bucket_cost(30 * 86_400, counts=counts).dollars * 1e6)
    assert data["buckets_counts_volume"] == counts.volume
    assert data["auto_route"] == choose_long_delay_route(30 * 86_400, figures, per_minute=100)
    assert set(data["auto_route_by_traffic"]) == {"100", "1000", "10000"}
    assert data["auto_route_by_traffic"]["100"] == data["auto_route_by_delay"]
    monkeypatch.setenv("DELAYED_DELIVERY_AUTO_TRAFFIC_PER_MINUTE", "7")  # the setting's variable is the default
    assert set(ok_json("cost", "--delay", "30d")["auto_route_by_traffic"]) == {"7", "100", "1000", "10000"}
    refused = run("cost", "--delay", "30d", "--per-minute", "0")
    assert refused.exit_code != 0 and "--per-minute must be at least 1" in refused.output
