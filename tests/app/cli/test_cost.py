"""``cost``: the NServiceBus formula beside the measured requests per hop and Scheduler, per 64 KiB chunk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.__main__ import refresh_measured
from benchmarks.common import Row
from delayed_delivery.cost import MeasuredFigures, load_measured_figures
from delayed_delivery.errors import ConfigurationError
from tests.app.cli.conftest import ok_json, one_line_error, run


def test_measured_figure_beats_the_nservicebus_formula_and_scheduler_is_flat() -> None:
    data = ok_json("cost", "--delay", "30d", "--size", "2048", "--messages", "1000000")
    assert data["seed_formula_usd_total"] == pytest.approx(2880.0)
    assert data["nservicebus_formula_usd_total"] == data["seed_formula_usd_total"]  # the old key stays for scripts
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


def test_the_formula_is_named_and_parks_carry_their_real_length() -> None:
    result = run("cost", "--delay", "30d")
    assert result.exit_code == 0
    assert "NServiceBus formula" in result.stdout and "42,600 s" in result.stdout
    assert "seed" not in result.stdout.lower() and "12 h" not in result.stdout
    assert "seed" not in run("cost", "--help").stdout.lower()


def test_figures_ship_as_package_data() -> None:
    shipped = load_measured_figures()
    assert shipped.requests_per_hop.value == pytest.approx(0.316)
    assert shipped.packed_requests_per_hop.value == 0.083
    park, hop = shipped.requests_per_park.value, shipped.parked_requests_per_hop.value  # counted per step (aws_costs)
    assert 0.01 < park < hop < 0.1  # a park is never free and costs less than a hop; a re-run moves the digits
    assert "aws_costs" in shipped.requests_per_park.source
    data = ok_json("cost", "--delay", "30d")
    assert data["our_measured_requests_per_hop"] == shipped.requests_per_hop.value
    assert data["our_measured_requests_per_hop_source"] == shipped.requests_per_hop.source


def test_a_suite_run_rewrites_only_the_figures_it_measured(tmp_path: Path) -> None:
    path = tmp_path / "measured.json"
    path.write_text(json.dumps(load_measured_figures().as_dict()))
    rows = [
        Row("sqs_hops", "fifo_requests_per_message_per_hop", "requests", (0.3, 0.2, 0.25)),
        Row("sqs_hops", "hops_per_message", "hops", (10.0,)),
    ]
    assert refresh_measured(rows, path) == ["requests_per_hop"]
    figures = MeasuredFigures.from_dict(json.loads(path.read_text()))
    assert figures.requests_per_hop.value == 0.25 and "benchmarks.sqs_hops" in figures.requests_per_hop.source
    assert figures.packed_requests_per_hop == load_measured_figures().packed_requests_per_hop
    assert refresh_measured([rows[1]], path) == []


def test_malformed_figures_are_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="malformed"):
        MeasuredFigures.from_dict({"requests_per_hop": {"value": "x", "source": "s"}})
