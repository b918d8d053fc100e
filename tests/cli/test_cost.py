"""``cost``: the seed formula beside the measured requests per hop and EventBridge Scheduler, per 64 KiB chunk."""

from __future__ import annotations

import pytest

from tests.cli.conftest import ok_json, one_line_error, run


def test_measured_figure_beats_the_seed_formula_and_scheduler_is_flat() -> None:
    data = ok_json("cost", "--delay", "30d", "--size", "2048", "--messages", "1000000")
    assert data["seed_formula_usd_total"] == pytest.approx(2880.0)
    assert data["our_plan_fifo_cycles"] == 2879
    assert 0 < data["our_measured_requests_per_hop"] < 2
    assert data["our_measured_usd_total"] < data["seed_formula_usd_total"]
    assert data["eventbridge_scheduler_usd_total"] == pytest.approx(1.4)
    assert data["our_measured_requests_per_hop_source"]


def test_size_is_billed_per_64_kib_chunk() -> None:
    small = ok_json("cost", "--delay", "1d", "--size", "65536")
    big = ok_json("cost", "--delay", "1d", "--size", "65537")
    assert (small["billed_chunks_per_request"], big["billed_chunks_per_request"]) == (1, 2)
    assert big["seed_formula_usd_total"] == pytest.approx(2 * small["seed_formula_usd_total"])
    assert big["our_measured_usd_total"] == pytest.approx(2 * small["our_measured_usd_total"])
    assert ok_json("cost", "--delay", "1d", "--size", "300000")["eventbridge_scheduler_usd_total"] is None


def test_table_names_the_source_of_the_measured_figure() -> None:
    result = run("cost", "--delay", "365d")
    assert result.exit_code == 0 and "measured" in result.stdout and "Scheduler" in result.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [(["--delay", "soon"], "cannot read duration"), (["--delay", "1d", "--size", "0"], "--size must be")],
)
def test_bad_input(args: list[str], needle: str) -> None:
    one_line_error(run("cost", *args), needle)


def test_parked_row_prices_the_parks_and_the_few_hops_of_a_long_delay() -> None:
    data = ok_json("cost", "--delay", "30d", "--size", "1024", "--messages", "1000000")
    assert (data["our_parked_parks"], data["our_parked_hops"]) == (63, 7)  # planning.sqs_park_schedule (42,600 s parks)
    assert 0 < data["our_parked_requests_per_park"] < data["our_parked_requests_per_hop"] < 1
    assert data["our_parked_usd_total"] < data["our_packed_usd_total"] / 10
    assert data["our_parked_requests_source"]
    # no measurement for larger messages: no parked row, as for the packed one
    assert ok_json("cost", "--delay", "30d", "--size", "2048")["our_parked_usd_total"] is None
    result = run("cost", "--delay", "1d")
    assert result.exit_code == 0 and "parked" in result.stdout
