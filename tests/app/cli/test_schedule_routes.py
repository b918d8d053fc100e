"""``schedule create|list|describe|pause|resume|backfill|delete`` and ``send --every`` on SQLite, PostgreSQL, AWS
(moto server) and Azure (Azurite): what each prints, the DST warning, pause cancelling by id (or saying SQS cannot),
backfill refusing what the cursor passed, one-line errors."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from delayed_delivery.clock import ManualClock
from delayed_delivery.schedules.materializer import Materializer
from delayed_delivery.schedules.sqlite_store import SqliteScheduleStore
from delayed_delivery.sqlite_store import SqliteDelayedMessageStore
from tests.app.cli.conftest import ok_json, one_line_error, run

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient


@pytest.fixture
def store(tmp_path: Path) -> list[str]:
    return ["--store", f"sqlite:///{tmp_path / 'd.db'}"]


def _db(route: list[str]) -> str:
    return route[1][len("sqlite:///") :]


def _messages(route: list[str]) -> SqliteDelayedMessageStore:
    """The message store beside the schedules (its table made, as a dispatcher's loop makes it)."""
    store = SqliteDelayedMessageStore(_db(route))
    store.setup_infrastructure()
    return store


def test_create_prints_the_next_five_and_warns_about_daylight_saving(store: list[str]) -> None:
    made = run("schedule", "create", "night", "30 2 * * *", "--tz", "America/New_York", "--to", "reports",
               "--body", "hi", "--start", "2027-01-01T00:00:00Z", *store)  # fmt: skip
    assert made.exit_code == 0, made.output
    assert "created schedule night" in made.stdout and "night@2027-01-01T07:30:00Z" in made.stdout
    assert made.stdout.count("@2027-01-0") == 5
    assert "02:30 does not exist on 2027-03-14: shifted to 03:30" in made.stderr
    doc = ok_json("schedule", "describe", "night", *store)
    assert doc["expression"] == "30 2 * * *" and doc["zone"] == "America/New_York" and doc["state"] == "active"
    assert [d["note"] for d in doc["dst_decisions"]][:1] == ["02:30 does not exist on 2027-03-14: shifted to 03:30"]


def test_a_named_time_clear_of_daylight_saving_gets_no_warning(store: list[str]) -> None:
    made = run("schedule", "create", "nine", "0 9 * * *", "--tz", "Europe/Berlin", "--to", "r", "--body", "b",
               *store)  # fmt: skip
    assert made.exit_code == 0 and "daylight saving" not in made.stderr


def test_list_shows_expression_zone_policy_state_fires_and_missed(store: list[str]) -> None:
    for sid, expr in (("a", "0 9 * * *"), ("b", "rate(15 minutes)")):
        assert run("schedule", "create", sid, expr, "--tz", "Europe/Berlin", "--to", "r", "--body", "x",
                   *store).exit_code == 0  # fmt: skip
    listed = run("schedule", "list", *store)
    assert listed.exit_code == 0
    for text in ("expression", "zone", "policy", "state", "last fired", "next fire (UTC)", "next (local)", "missed",
                 "rate(15 minutes)", "Europe/Berlin", "catch-up all"):  # fmt: skip
        assert text in listed.stdout, text
    doc = ok_json("schedule", "list", *store, "--limit", "1")
    assert [s["id"] for s in doc["schedules"]] == ["a"]
    assert doc["schedules"][0]["next_fire"]["nominal"].endswith(("08:00:00Z", "07:00:00Z"))


def test_pause_cancels_materialized_occurrences_and_resume_counts_the_span(store: list[str]) -> None:
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=1)
    assert run("schedule", "create", "p", "rate(1 minutes)", "--to", "r", "--body", "x", "--start",
               start.isoformat(), *store).exit_code == 0  # fmt: skip
    Materializer(SqliteScheduleStore(_db(store)), _messages(store), lead_seconds=600).run_once()  # a loop's pass
    pending = ok_json("pending", *store)["pending"]
    assert pending >= 10
    paused = ok_json("schedule", "pause", "p", *store)
    assert paused["state"] == "paused" and len(paused["cancelled"]) >= 9
    assert ok_json("pending", *store)["pending"] == pending - len(paused["cancelled"])
    doc = ok_json("schedule", "describe", "p", *store)
    assert doc["state"] == "paused" and doc["materialized"] == []
    resumed = ok_json("schedule", "resume", "p", *store)
    assert resumed["state"] == "active" and resumed["skipped_paused"] >= 0


def test_backfill_refuses_what_the_cursor_passed_unless_again(store: list[str]) -> None:
    start = datetime.now(UTC).replace(microsecond=0, second=0) - timedelta(hours=3)
    assert run("schedule", "create", "h", "0 * * * *", "--to", "r", "--body", "x", "--start", start.isoformat(),
               *store).exit_code == 0  # fmt: skip
    Materializer(SqliteScheduleStore(_db(store)), _messages(store), lead_seconds=0).run_once()  # catch-up
    before = (start - timedelta(hours=5)).isoformat()
    history = ok_json("schedule", "backfill", "h", "--from", before, "--to", start.isoformat(), *store)
    assert len(history["written"]) == 5 and all(i.startswith("h@") for i in history["written"])
    refused = run("schedule", "backfill", "h", "--from", start.isoformat(), "--to",
                  datetime.now(UTC).isoformat(), *store)  # fmt: skip
    one_line_error(refused, "already fired or recorded", "again")


def test_delete_cancels_and_forgets(store: list[str]) -> None:
    assert run("schedule", "create", "d", "*/5 * * * *", "--to", "r", "--body", "x", *store).exit_code == 0
    gone = ok_json("schedule", "delete", "d", *store)
    assert gone["deleted"] is True
    one_line_error(run("schedule", "describe", "d", *store), "no schedule 'd'")


def test_send_every_is_a_shortcut_of_create(store: list[str]) -> None:
    doc = ok_json("send", "--to", "reports", "--every", "0 9 * * *", "--tz", "Europe/Berlin", "--body", "hi",
                  "--id", "via-send", *store)  # fmt: skip
    assert doc["schedule"]["id"] == "via-send" and doc["schedule"]["zone"] == "Europe/Berlin"
    one_line_error(run("send", "--to", "r", "--every", "0 9 * * *", "--delay", "1h", "--body", "x", *store),
                   "--every")  # fmt: skip


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["schedule", "create", "x", "0 0 30 2 *", "--to", "r", "--body", "b"], "never fires"),
        (["schedule", "create", "x", "0 9 * * *", "--tz", "EST", "--to", "r", "--body", "b"], "unknown time zone"),
        (["schedule", "create", "bad id", "0 9 * * *", "--to", "r", "--body", "b"], "schedule id"),
        (["schedule", "pause", "nope"], "no schedule 'nope'"),
        (["schedule", "resume", "nope"], "no schedule 'nope'"),
    ],
)
def test_mistakes_are_one_line(store: list[str], args: list[str], needle: str) -> None:
    one_line_error(run(*args, *store), needle)


def test_an_id_taken_is_one_line(store: list[str]) -> None:
    assert run("schedule", "create", "t", "0 9 * * *", "--to", "r", "--body", "b", *store).exit_code == 0
    one_line_error(run("schedule", "create", "t", "0 9 * * *", "--to", "r", "--body", "b", *store), "exists already")


@pytest.mark.azurite
def test_on_azure_the_timer_writes_rows_the_dispatcher_delivers_once_and_pause_cancels(
    azurite_conn: str, unique_name: str
) -> None:
    from azure.storage.queue import QueueServiceClient

    from delayed_delivery.azure.config import AzureDelayedDeliveryConfig
    from delayed_delivery.azure.runner import AzureDispatcherHost
    from delayed_delivery.azure.schedules.timer import timer_for_host
    from tests.azure.harness import drain

    queues = QueueServiceClient.from_connection_string(azurite_conn)
    queues.create_queue(unique_name)
    assert run("azure", "setup", "--connection-string", azurite_conn, "--endpoint", unique_name).exit_code == 0
    azure = ["--cloud", "azure", "--connection-string", azurite_conn, "--endpoint", unique_name]
    one_line_error(run("schedule", "create", "q", "0 9 * * *", "--to", "No_Queue", "--body", "b", *azure), "queue")
    start = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=2)
    made = ok_json("schedule", "create", "tick", "rate(1 minutes)", "--to", unique_name, "--body", "tick", "--start",
                   start.isoformat(), *azure)  # fmt: skip
    assert made["route"] == "azure"
    assert [(s["id"], s["state"]) for s in ok_json("schedule", "list", *azure)["schedules"]] == [("tick", "active")]
    one_line_error(run("schedule", "create", "tick", "0 9 * * *", "--to", unique_name, "--body", "b", *azure),
                   "exists already")  # fmt: skip

    config = AzureDelayedDeliveryConfig.for_endpoint(unique_name, connection_string=azurite_conn, run_seconds=3.0,
                                                     lease_seconds=15)  # fmt: skip
    host = AzureDispatcherHost(config)
    host.setup_infrastructure()
    first = timer_for_host(host, {"DELAYED_DELIVERY_SCHEDULE_LEAD_SECONDS": "600"}).run()  # the function's pass
    assert first.fired_late >= 2 and first.fired >= first.fired_late + 9
    assert ok_json("pending", *azure)["pending"] == first.fired  # occurrences are rows of the delays table
    doc = ok_json("schedule", "describe", "tick", *azure)
    assert doc["fired"] == first.fired and all("delays table" in m["where"] for m in doc["materialized"])
    host.run(budget=3.0)
    delivered = [e.message_id for e in drain(queues, unique_name)]
    assert len(delivered) == len(set(delivered)) >= first.fired_late and all(i.startswith("tick@") for i in delivered)
    assert set(delivered) <= set(first.ids)

    paused = ok_json("schedule", "pause", "tick", *azure)
    assert paused["state"] == "paused" and len(paused["cancelled"]) >= 8
    assert not set(paused["cancelled"]) & set(delivered)
    assert ok_json("pending", *azure)["pending"] <= first.fired - len(delivered) - len(paused["cancelled"])
    assert timer_for_host(host, {}).run().fired == 0  # paused: nothing written
    resumed = ok_json("schedule", "resume", "tick", *azure)
    assert resumed["state"] == "active"
    # the schedule timer's pass and a dispatcher run, here (what the function app's two timers do)
    ran = run("azure", "dispatch", "--connection-string", azurite_conn, "--endpoint", unique_name, "--seconds", "3",
              "--schedules")  # fmt: skip
    assert ran.exit_code == 0, ran.output
    done = json.loads(ran.stdout)
    assert done["schedules"]["fired"] >= 1 and done["schedules"]["failures"] == 0
    later = [e.message_id for e in drain(queues, unique_name)]
    assert not set(later) & set(delivered), "an occurrence is delivered once"
    assert len(later) == len(set(later)) == done["dispatched"] and all(i.startswith("tick@") for i in later)
    span = ["--from", start.isoformat(), "--to", (start + timedelta(minutes=2)).isoformat()]
    one_line_error(run("schedule", "backfill", "tick", *span, *azure), "again")  # the cursor passed them
    back = ok_json("schedule", "backfill", "tick", *span, "--again", *azure)
    assert back["written"] == [f"tick@{(start + timedelta(minutes=m)):%Y-%m-%dT%H:%M:%SZ}" for m in (0, 1)]
    host.run(budget=3.0)
    history = [e.message_id for e in drain(queues, unique_name)]
    assert sorted(history) == sorted(back["written"])
    assert ok_json("schedule", "delete", "tick", *azure)["deleted"] is True


@pytest.mark.postgres
def test_on_postgresql(postgres_conninfo: str) -> None:
    url = postgres_conninfo if postgres_conninfo.startswith("postgres") else None
    if url is None:
        from psycopg.conninfo import conninfo_to_dict

        parts: dict[str, Any] = conninfo_to_dict(postgres_conninfo)
        url = f"postgresql://{parts.get('user', '')}@{parts.get('host', '127.0.0.1')}:{parts['port']}/{parts['dbname']}"
    route = ["--store", url]
    made = ok_json("schedule", "create", "pg-cli", "0 9 * * *", "--tz", "Europe/Berlin", "--to", "r", "--body", "b",
                   *route)  # fmt: skip
    assert made["route"] == "store"
    assert [s["id"] for s in ok_json("schedule", "list", *route)["schedules"]] == ["pg-cli"]
    assert ok_json("schedule", "pause", "pg-cli", *route)["state"] == "paused"
    assert ok_json("schedule", "delete", "pg-cli", *route)["deleted"] is True


@pytest.mark.moto
def test_on_aws_the_timer_sends_and_pause_says_sqs_cannot_withdraw(
    moto_endpoint: str, sqs: SQSClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DELAYED_DELIVERY_ERROR_QUEUE", "errors")
    created = run("aws", "create", "--queue", "reports", "--endpoint-url", moto_endpoint, "--region", "us-east-1")
    assert created.exit_code == 0 and '"schedule_table": "delayed-delivery-schedules"' in created.stdout
    aws = ["--cloud", "aws", "--endpoint-url", moto_endpoint, "--region", "us-east-1"]
    one_line_error(run("schedule", "create", "f", "0 9 * * *", "--to", "r.fifo", "--body", "b", *aws), "FIFO")
    start = datetime.now(UTC).replace(microsecond=0)
    made = ok_json("schedule", "create", "m", "rate(1 minutes)", "--to", "reports", "--body", "tick", "--start",
                   start.isoformat(), *aws)  # fmt: skip
    assert made["route"] == "aws"
    from delayed_delivery.aws.schedules.sends import OccurrenceSender
    from delayed_delivery.aws.schedules.store import DynamoDbScheduleStore
    from delayed_delivery.aws.schedules.timer import ScheduleTimer
    from tests.aws.schedules.conftest import schedule_dynamodb

    clock = ManualClock(start + timedelta(seconds=1))
    table = DynamoDbScheduleStore(schedule_dynamodb(moto_endpoint), "delayed-delivery-schedules", clock=clock)
    sent = ScheduleTimer(table, OccurrenceSender(sqs, "errors", clock), clock, lead_seconds=120).run()
    assert sent.fired >= 2
    doc = ok_json("schedule", "describe", "m", *aws)
    assert doc["fired"] == sent.fired and all("with its delay" in m["where"] for m in doc["materialized"])
    paused = run("schedule", "pause", "m", *aws)
    assert paused.exit_code == 0 and "SQS cannot withdraw" in paused.stderr
    listed = ok_json("schedule", "list", *aws)
    assert [(s["id"], s["state"]) for s in listed["schedules"]] == [("m", "paused")]
    began = start - timedelta(minutes=10)
    assert run("schedule", "create", "c", "* * * * *", "--to", "reports", "--body", "history", "--start",
               began.isoformat(), *aws).exit_code == 0  # fmt: skip
    back = ok_json("schedule", "backfill", "c", "--from", (began - timedelta(minutes=5)).isoformat(), "--to",
                   began.isoformat(), *aws)  # fmt: skip
    assert len(back["written"]) == 5 and back["not_sent"] == []  # before its start: sent now, on SQS
    url = sqs.get_queue_url(QueueName="reports")["QueueUrl"]
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=5, MessageAttributeNames=["All"])
    ids = {
        m["MessageAttributes"]["DelayedDelivery.Occurrence"]["StringValue"]
        for m in got.get("Messages", [])
        if m["MessageAttributes"]["DelayedDelivery.ScheduleId"]["StringValue"] == "c"
    }
    assert ids and all(i < began.strftime("%Y-%m-%dT%H:%M:%SZ") for i in ids)
