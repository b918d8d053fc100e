"""The demo end to end: the cloud demo on its own emulators in a tiny mode, and the core-only demo."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from delayed_delivery.app.cli import app
from delayed_delivery.app.demo.cloud import CloudDemoResult, CloudSummary

pytestmark = [pytest.mark.moto, pytest.mark.azurite]


def test_cloud_demo_tiny_loses_nothing_and_reports_a_sane_summary() -> None:
    result = CliRunner().invoke(
        app, ["demo", "--quick", "--json", "--messages", "9", "--year-seconds", "8"], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["ok"] is True and data["lost"] == 0
    clouds = {c["cloud"]: c for c in data["clouds"]}
    assert set(clouds) == {"aws", "azure"}
    aws, azure = clouds["aws"], clouds["azure"]
    for c in (aws, azure):
        assert c["delivered"] == c["expected_deliveries"] == 10  # the mix + the rescheduled one
        assert c["lost"] == 0 and c["early"] == 0
        assert c["error_queue"] == c["expected_error_queue"] == 2
        assert 0 <= c["lateness_p50"] <= c["lateness_p99"] < 10
    assert aws["by_delay"]["1 year"]["delivered"] == aws["by_delay"]["1 year"]["messages"] == 1
    assert azure["by_delay"]["rescheduled"] == {**azure["by_delay"]["rescheduled"], "messages": 1, "delivered": 1}
    # the long delays hopped through -delay.fifo, each hop costing a few requests, not dozens
    assert aws["routes"]["fifo"] >= 2 and aws["requests"]["hops"] > aws["routes"]["fifo"]
    assert 1 <= aws["requests"]["requests_per_hop"] < 6
    # AWS: the cancel and reschedule records were applied at the next hop (records read once per invocation)
    assert aws["cancelled"] == 1 and aws["cancelled_but_delivered"] == 0 and aws["rescheduled"] == 1
    assert aws["by_delay"]["rescheduled"] == {**aws["by_delay"]["rescheduled"], "messages": 1, "delivered": 1}
    assert aws["requests"]["cancellation_queries"] >= 1 and aws["requests"]["cancellation_deletes"] >= 2
    for c in (aws, azure):
        [late] = c["rescheduled_lateness"]
        assert late is not None and late >= -0.25  # no earlier than its new due time
    # Azure: the table route took the long ones, the cancelled one never arrived, the rescheduled one did
    assert azure["routes"]["table"] >= 3 and azure["routes"]["native"] >= 3
    assert azure["cancelled"] == 1 and azure["cancelled_but_delivered"] == 0 and azure["rescheduled"] == 1
    assert azure["requests"]["requests_per_message"] > 1 and azure["requests"]["timer_runs"] >= 1
    # Azure: one capped destination; its burst, due at one instant, released by the timer function at the cap
    capped = azure["release"]
    assert (capped["destination"], capped["rate"]) == ("invoices", 4.0)
    assert capped["delivered"] == capped["messages"] == 16 and capped["lost"] == 0 and capped["early"] == 0
    assert capped["routes"] == {"table": 16} and capped["slots"] >= 16  # every message booked a slot
    assert 1 <= capped["busiest_second"] <= capped["rate"]
    # 16 due at once at 2/s per shard: all but each shard's first wait for a slot
    assert 0 < capped["release_lag_p50"] <= capped["release_lag_p99"] <= capped["release_lag_max"]
    # one recurring schedule per cloud, materialized by that cloud's schedule timer: every occurrence once, none missed
    for c in (aws, azure):
        r = c["recurring"]
        assert r["expression"] == "rate(3 seconds)" and r["destination"] == "digest"
        assert r["fired"] == r["expected"] >= 1 and r["missed"] == r["lost"] == r["duplicates"] == r["early"] == 0
        assert len(r["occurrences"]) == r["fired"]
        assert all(i.startswith(f"{r['schedule_id']}@") for i in r["occurrences"])


def test_core_demo_is_still_there() -> None:
    result = CliRunner().invoke(app, ["demo", "--core", "--json", "--messages", "16", "--span", "2"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["lost"] == 0 and data["delivered"] == 16
    # one capped destination, with what the cap added to its messages beside the others' lateness
    assert (data["release_destination"], data["release_rate"]) == ("billing", 20.0)
    assert 0 <= data["release_lag_p50"] <= data["release_lag_p99"] <= data["release_lag_max"]
    assert data["release_busiest_second"] >= 1


def test_demo_rejects_an_unknown_cloud() -> None:
    result = CliRunner().invoke(app, ["demo", "--cloud", "gcp"])
    assert result.exit_code == 2
    assert "--cloud must be aws, azure or both" in result.stderr


def _capped(**changes: object) -> dict[str, object]:
    capped: dict[str, object] = {
        "destination": "invoices", "rate": 4.0, "messages": 16, "delivered": 16, "lost": 0, "duplicates": 0,
        "early": 0, "routes": {"table": 16}, "release_lag_p50": 1.5, "release_lag_p99": 3.5, "release_lag_max": 3.5,
        "busiest_second": 4, "slots": 16, "arrival_span": 3.9,
    }  # fmt: skip
    return {**capped, **changes}


def test_the_summary_shows_the_capped_destination_and_a_broken_cap_fails_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import delayed_delivery.app.demo.cloud as cloud_demo

    def run(capped: dict[str, object]) -> tuple[int, str]:
        result = CloudDemoResult([_summary("aws"), _summary("azure", release=capped)], 1e6, 30.0, {}, 1.0)
        monkeypatch.setattr(cloud_demo, "run_cloud_demo", lambda config, **kwargs: result)
        out = CliRunner().invoke(app, ["demo"])
        return out.exit_code, " ".join(out.stdout.split())

    code, text = run(_capped())
    assert code == 0
    assert "release control: invoices capped at 4/s (16 due at once) │ │ busiest second 4" in text
    assert "release lag p50 / p99 / max (real s, invoices) │ │ 1.50 / 3.50 / 3.50" in text
    assert "delivered / lost (must be 0), arrived over │ │ 16 / 0, 3.9 s" in text
    assert run(_capped(busiest_second=5))[0] == 1  # a second over the cap is a failed run
    assert run(_capped(lost=1, delivered=15))[0] == 1


def _recurring(**changes: object) -> dict[str, object]:
    recurring: dict[str, object] = {
        "schedule_id": "demo-aws-1", "expression": "rate(3 seconds)", "destination": "digest", "expected": 2,
        "fired": 2, "missed": 0, "lost": 0, "duplicates": 0, "early": 0, "lateness_p50": 0.4, "lateness_p99": 0.9,
        "lateness_max": 0.9, "occurrences": ["demo-aws-1@2026-11-28T09:00:01Z", "demo-aws-1@2026-11-28T09:00:04Z"],
    }  # fmt: skip
    return {**recurring, **changes}


def test_the_summary_shows_each_clouds_recurring_schedule_and_a_duplicate_fails_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import delayed_delivery.app.demo.cloud as cloud_demo

    def run(azure: dict[str, object]) -> tuple[int, str]:
        clouds = [_summary("aws", recurring=_recurring()), _summary("azure", recurring=azure)]
        result = CloudDemoResult(clouds, 1e6, 30.0, {}, 1.0)
        monkeypatch.setattr(cloud_demo, "run_cloud_demo", lambda config, **kwargs: result)
        out = CliRunner().invoke(app, ["demo"])
        return out.exit_code, " ".join(out.stdout.split())

    code, text = run(_recurring(fired=1, missed=1, occurrences=["demo-azure-1@2026-11-28T09:00:04Z"]))
    assert code == 0, text  # a missed occurrence is reported (catch-up policy), not a lost one
    assert "recurring schedule rate(3 seconds) to digest: fired / expected / missed │ 2 / 2 / 0 │ 1 / 2 / 1" in text
    assert "occurrences delivered (nominal, UTC) │ 09:00:01, 09:00:04 │ 09:00:04" in text
    assert run(_recurring(duplicates=1))[0] == 1
    assert run(_recurring(lost=1, fired=1))[0] == 1


def _summary(cloud: str, **changes: object) -> CloudSummary:
    base: dict[str, object] = {
        "cloud": cloud, "sent": 3, "expected_deliveries": 2, "delivered": 2, "lost": 0, "duplicates": 0, "early": 0,
        "error_queue": 1, "expected_error_queue": 1, "cancelled": 0, "cancelled_but_delivered": 0, "rescheduled": 0,
        "lateness_p50": 0.5, "lateness_p99": 0.9, "lateness_max": 0.9,
        "requests": {"hops": 4, "hops_per_long_message": 4, "requests_per_hop": 1.0, "requests_per_message": 3.0,
                     "empty_receives": 2, "function_table_requests": 5, "function_queue_requests": 2,
                     "function_blob_requests": 3, "timer_runs": 1},
    }  # fmt: skip
    base.update(changes)
    return CloudSummary(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("aws", "expected"),
    [
        ({}, 0),
        ({"lost": 1, "delivered": 1}, 1),
        ({"error_queue": 0}, 1),
        ({"cancelled": 1, "cancelled_but_delivered": 1}, 1),
    ],
)
def test_exit_code_is_1_when_anything_was_lost(
    monkeypatch: pytest.MonkeyPatch, aws: dict[str, object], expected: int
) -> None:
    import delayed_delivery.app.demo.cloud as cloud_demo

    def fake(config: object, **kwargs: object) -> CloudDemoResult:
        return CloudDemoResult([_summary("aws", **aws), _summary("azure")], 1e6, 30.0, {}, 1.0)

    monkeypatch.setattr(cloud_demo, "run_cloud_demo", fake)
    result = CliRunner().invoke(app, ["demo", "--json"])
    assert result.exit_code == expected, result.output
    assert json.loads(result.stdout)["ok"] is (expected == 0)
    table = CliRunner().invoke(app, ["demo"])
    assert table.exit_code == expected and "lost (must be 0)" in table.stdout
