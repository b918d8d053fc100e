"""Issue 7's bad-input matrix against the real routes: every operator command on SQS (moto server), Azure (Azurite)
and a SQL store (SQLite) answers an unknown queue, a bad duration or a missing body file with one ``error:`` line
and exit code 2, never a traceback."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from azure.storage.queue import QueueServiceClient

from delayed_delivery.aws.queues import ensure_endpoint
from delayed_delivery.settings import DelayedDeliverySettings
from tests.app.cli.conftest import one_line_error, run

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

ROUTES = [
    pytest.param("aws", marks=pytest.mark.moto, id="aws"),
    pytest.param("azure", marks=pytest.mark.azurite, id="azure"),
    pytest.param("store", id="store"),
]
CLOUDS = ROUTES[:2]


@pytest.fixture
def route(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[list[str], str]:
    """(route options, an existing queue) for the parametrized route."""
    if request.param == "aws":
        sqs: SQSClient = request.getfixturevalue("sqs")
        ensure_endpoint(sqs, "orders", DelayedDeliverySettings())
        url = request.getfixturevalue("moto_endpoint")
        return ["--cloud", "aws", "--endpoint-url", url, "--region", "us-east-1"], "orders"
    if request.param == "azure":
        conn, name = request.getfixturevalue("azurite_conn"), request.getfixturevalue("unique_name")
        QueueServiceClient.from_connection_string(conn).create_queue(name)
        assert run("azure", "setup", "--connection-string", conn, "--endpoint", name).exit_code == 0
        return ["--cloud", "azure", "--connection-string", conn, "--endpoint", name], name
    return ["--store", f"sqlite:///{tmp_path / 'd.db'}"], "orders"


@pytest.mark.parametrize("route", ROUTES, indirect=True)
def test_send_bad_duration(route: tuple[list[str], str]) -> None:
    options, queue = route
    one_line_error(run("send", *options, "--to", queue, "--delay", "10x", "--body", "a"), "cannot read duration")
    one_line_error(run("send", *options, "--to", queue, "--at", "next week", "--body", "a"), "ISO-8601")


@pytest.mark.parametrize("route", ROUTES, indirect=True)
def test_send_missing_body_file(route: tuple[list[str], str], tmp_path: Path) -> None:
    options, queue = route
    missing = tmp_path / "missing.json"
    result = run("send", *options, "--to", queue, "--delay", "40d", "--body", f"@{missing}")
    one_line_error(result, "cannot read body file", "missing.json")


@pytest.mark.parametrize("route", CLOUDS, indirect=True)
def test_send_unknown_and_invalid_queue(route: tuple[list[str], str]) -> None:
    options, _ = route
    for delay in ("60s", "40d"):  # native and long routes both check the destination first
        one_line_error(run("send", *options, "--to", "no-such-queue", "--delay", delay, "--body", "a"), "no-such-queue")
    one_line_error(run("send", *options, "--to", "Bad/Name!", "--delay", "1h", "--body", "a"), "Bad/Name!")


@pytest.mark.parametrize("route", ROUTES, indirect=True)
def test_reschedule_bad_duration_and_time(route: tuple[list[str], str]) -> None:
    options, queue = route
    extra = ["--to", queue] if "aws" in options else []
    one_line_error(run("reschedule", "x", *options, *extra, "--delay", "10x"), "cannot read duration")
    one_line_error(run("reschedule", "x", *options, *extra, "--at", "soon"), "ISO-8601")
    one_line_error(run("reschedule", "x", *options, *extra), "exactly one of --delay or --at")


@pytest.mark.parametrize("route", ROUTES, indirect=True)
def test_reschedule_to_a_past_or_out_of_range_time_is_refused(route: tuple[list[str], str]) -> None:
    # #23: `reschedule m7 --at 1960-01-01T00:00:00Z --cloud aws --to orders` exited 0 and wrote a record the tier's
    # timer could not use (its whole bucket stalled); every route refuses such a time before writing anything
    options, queue = route
    extra = ["--to", queue] if "aws" in options else []
    for at in ("1960-01-01T00:00:00Z", "1970-01-01T00:00:00Z", "2001-09-09T01:46:40+02:00"):
        one_line_error(run("reschedule", "m7", *options, *extra, "--at", at), "is in the past", "--at")
    one_line_error(run("reschedule", "m7", *options, *extra, "--at", "9500-01-01T00:00:00Z"), "100-year")


@pytest.mark.parametrize("route", ROUTES, indirect=True)
def test_pending_bad_bucket(route: tuple[list[str], str]) -> None:
    options, _ = route
    one_line_error(run("pending", *options, "--by", "week"), "--by must be hour or day")


@pytest.mark.parametrize("route", [ROUTES[1], ROUTES[2]], indirect=True)
def test_sqs_only_options_elsewhere(route: tuple[list[str], str]) -> None:
    options, queue = route
    one_line_error(run("cancel", "x", *options, "--to", queue), "--to and --due are for --cloud aws")
    one_line_error(run("cancel", "x", *options, "--due", "2030-01-01T00:00:00Z"), "--cloud aws")
    one_line_error(run("reschedule", "x", *options, "--to", queue, "--delay", "1h"), "--cloud aws")
    one_line_error(run("pending", *options, "--queue", queue), "--queue is for --cloud aws")


@pytest.mark.parametrize("route", [ROUTES[0]], indirect=True)
def test_sqs_send_bad_messages(route: tuple[list[str], str]) -> None:
    options, queue = route
    one_line_error(run("send", *options, "--to", queue, "--delay", "1h", "--body", ""), "empty body")
    headers = [arg for i in range(10) for arg in ("-H", f"h{i}=v")]
    one_line_error(run("send", *options, "--to", queue, "--delay", "40d", "--body", "a", *headers), "at most 9")
    one_line_error(run("send", *options, "--to", queue, "--delay", "40d", "--body", "a", "--id", "has space"), "id")
    one_line_error(run("send", *options, "--to", queue, "--delay", "1h", "--body", "a", "-H", "novalue"), "key=value")
    one_line_error(run("send", *options, "--to", queue, "--delay", "1h", "--body", "a", "--cancellable"), "azure")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--delay", "1d", "--messages", "0"], "--messages must be at least 1"),
        (["--delay", "1d", "--size", "2000000"], "--size must be"),
        (["--delay", "-1d"], "negative durations are not allowed"),
        (["--delay", "200y"], "100-year"),
    ],
)
def test_cost_bad_input(args: list[str], needle: str) -> None:
    one_line_error(run("cost", *args), needle)


def test_unreachable_postgres_is_one_line() -> None:
    # psycopg's connection error spans two lines; the CLI still prints one
    one_line_error(run("pending", "--store", "postgresql://127.0.0.1:9/x"), "PostgreSQL unavailable", "Is the server")
