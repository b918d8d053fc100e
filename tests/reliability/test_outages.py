"""Emulator outages mid-run (``outagelab.py``): breakers trip on time, dispatching resumes, nothing lost or early."""

from __future__ import annotations

import pytest

from tests.reliability.outagelab import TRIP, azure_outage, postgres_outage, sqs_requeue_outage, sqs_transport_outage

#: Breakers trip on the first failure after TRIP seconds; failures come every 0.1-0.3 s (plus connect time).
TRIP_SLACK = 2.5


@pytest.mark.postgres
def test_postgres_restart_mid_send_trips_store_and_fetch_breakers_and_dispatching_resumes() -> None:
    result = postgres_outage(messages=150, outages=1, down=4.0)
    assert result.dispatcher_died is None, result.dispatcher_died
    assert result.lost == 0 and result.delivered == result.messages, result
    assert result.min_margin_s >= 0, f"delivered {-result.min_margin_s} s early"
    for breaker in ("store", "fetch"):
        assert breaker in result.trips, result.trips
        assert TRIP <= result.trips[breaker] <= TRIP + TRIP_SLACK, result.trips
    assert 0 <= result.resume_seconds[0] <= 5.0, result.resume_seconds
    # only the batch whose removal failed is sent again (its claims expire): at most one batch
    assert result.duplicates <= 10, result


@pytest.mark.azurite
def test_azurite_restart_under_timer_runs_loses_nothing_and_dispatching_resumes() -> None:
    result = azure_outage(messages=100, outages=1, down=12.0)
    assert result.lost == 0 and result.delivered == result.messages, result
    assert result.min_margin_s >= 0, f"delivered {-result.min_margin_s} s early"
    # the lease it held before the outage has expired (15 s) or is renewed: one lease plus SDK backoff at most
    assert 0 <= result.resume_seconds[0] <= 15 + 1 + 10, result.resume_seconds


@pytest.mark.moto
def test_sqs_cut_off_trips_the_dispatch_breaker_and_the_core_dispatcher_resumes(moto_endpoint: str) -> None:
    result = sqs_transport_outage(moto_endpoint, messages=100, outages=1, down=4.0)
    assert result.dispatcher_died is None, result.dispatcher_died
    assert result.lost == 0 and result.delivered == result.messages, result
    assert result.error_queue == 0, result
    assert result.min_margin_s >= 0, f"delivered {-result.min_margin_s} s early"
    assert "dispatch" in result.trips and TRIP <= result.trips["dispatch"] <= TRIP + TRIP_SLACK, result.trips
    assert 0 <= result.resume_seconds[0] <= 5.0, result.resume_seconds


@pytest.mark.moto
def test_sqs_cut_off_under_the_requeue_handler_loses_nothing(moto_endpoint: str) -> None:
    result = sqs_requeue_outage(moto_endpoint, messages=40, outages=1, down=4.0)
    assert result.poll_errors > 0, "the outage was not noticed"
    assert result.lost == 0 and result.delivered == result.messages, result
    assert result.error_queue == 0, result
    assert result.min_margin_s >= 0, f"delivered {-result.min_margin_s} s early"
    assert 0 <= result.resume_seconds[0] <= 10.0, result.resume_seconds
