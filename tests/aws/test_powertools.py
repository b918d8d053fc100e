"""The Powertools wiring the Lambda handlers share: the decorators around an invocation, the cancellation table."""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

import pytest
from aws_lambda_powertools.metrics.provider.cold_start import reset_cold_start_flag

from delayed_delivery.aws.powertools import HandlerTools
from delayed_delivery.testing.aws import LocalLambdaContext
from tests.aws.test_cancel_dynamodb import dynamodb_client


def _lines(capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]


def test_around_logs_with_the_lambda_context_and_flushes_the_metrics(capsys: pytest.CaptureFixture[str]) -> None:
    reset_cold_start_flag()  # Powertools keeps one cold-start flag per process: an earlier handler test took it
    service = f"tools-{uuid.uuid4().hex[:8]}"
    tools = HandlerTools.for_service(service, "NS")

    @tools.around
    def invocation(event: Any, context: Any) -> dict[str, Any]:
        tools.logger.info("inside", extra={"event": "probe"})
        tools.logger.append_keys(during=event["n"])
        tools.count("Probes", 2)
        return {"echo": event}

    capsys.readouterr()
    assert invocation({"n": 1}, LocalLambdaContext()) == {"echo": {"n": 1}}
    lines = _lines(capsys)
    inside = next(line for line in lines if line.get("message") == "inside")
    assert inside["service"] == service and inside["function_request_id"] and "during" not in inside
    emitted = next(line for line in lines if "Probes" in line)
    assert emitted["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "NS" and emitted["Probes"] in (2.0, [2.0])
    assert any("ColdStart" in line for line in lines)

    invocation({"n": 2}, LocalLambdaContext())
    lines = _lines(capsys)
    again = next(line for line in lines if line.get("message") == "inside")
    assert "during" not in again, "the keys of the previous invocation leaked into this one"
    assert not any("ColdStart" in line for line in lines), "a warm invocation counted a cold start"


@pytest.mark.usefixtures("in_a_lambda")
def test_in_a_lambda_the_packages_own_lines_go_out_as_json_with_their_keys(capsys: pytest.CaptureFixture[str]) -> None:
    """The tier's engines log through standard-library loggers (``delayed_delivery.aws.tier.timer``'s "bucket left
    for a later run"); in a Lambda the runtime's text format would keep only the message, not its event, bucket and
    reason. Every handler's tools, built in a Lambda, send them through Powertools' JSON handler."""
    tools = HandlerTools.for_service(f"tools-{uuid.uuid4().hex[:8]}", "NS")
    engine = logging.getLogger("delayed_delivery.aws.tier.timer")

    @tools.around
    def invocation(event: Any, context: Any) -> dict[str, Any]:
        engine.warning("bucket left for a later run", extra={"event": "retry", "bucket": "m/2030-01-01T00:00"})
        return {}

    capsys.readouterr()
    invocation({}, LocalLambdaContext(function_name="tier-timer"))
    lines = _lines(capsys)
    line = next(x for x in lines if x.get("message") == "bucket left for a later run")
    assert line["event"] == "retry" and line["bucket"] == "m/2030-01-01T00:00" and line["level"] == "WARNING"
    assert line["function_name"] == "tier-timer", "the invocation's keys, as on the handler's own lines"


def test_outside_a_lambda_the_packages_logging_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo and the local functions run handlers in threads beside the consumers' loggers: nothing rerouted."""
    monkeypatch.delenv("AWS_LAMBDA_FUNCTION_NAME", raising=False)
    package = logging.getLogger("delayed_delivery")
    before = (package.handlers[:], package.propagate)
    HandlerTools.for_service(f"tools-{uuid.uuid4().hex[:8]}", "NS")
    assert (package.handlers, package.propagate) == before


def test_no_table_means_no_cache() -> None:
    assert HandlerTools.for_service("s", "NS").cancellation_cache(None, None, 60) is None


@pytest.mark.moto
def test_an_unreachable_table_is_logged_and_counted_not_raised(capsys: pytest.CaptureFixture[str]) -> None:
    tools = HandlerTools.for_service(f"tools-{uuid.uuid4().hex[:8]}", "NS")
    cache = tools.cancellation_cache("records", dynamodb_client("http://127.0.0.1:9"), 0)
    assert cache is not None

    @tools.around
    def invocation(event: Any, context: Any) -> dict[str, Any]:
        return {"records": cache.lookup("orders")}

    capsys.readouterr()
    assert invocation({}, LocalLambdaContext()) == {"records": {}}
    lines = _lines(capsys)
    warning = next(line for line in lines if line.get("event") == "cancellation_records_unavailable")
    assert warning["level"] == "WARNING" and "127.0.0.1:9" in warning["reason"]
    assert any(line.get("CancellationLookupFailures") in (1.0, [1.0]) for line in lines)
