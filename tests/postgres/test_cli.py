"""The operator CLI against PostgreSQL: `send --delay` lets the database clock fix the due time."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest
from typer.testing import CliRunner

from delayed_delivery.app.cli import app
from delayed_delivery.postgres.store import PostgresDelayedMessageStore

pytestmark = pytest.mark.postgres


@pytest.fixture
def url(postgres_conninfo: str) -> Iterator[str]:
    fields = dict(re.findall(r"(\w+)=(\S+)", postgres_conninfo))
    yield f"postgresql://{fields['user']}@{fields['host']}:{fields['port']}/{fields['dbname']}"
    store = PostgresDelayedMessageStore(postgres_conninfo)
    store.drop_infrastructure()
    store.close()


def test_send_with_a_delay_uses_the_database_clock(url: str, postgres_conninfo: str) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["send", "--store", url, "--to", "orders", "--delay", "2h", "--body", "x", "--json"])
    assert result.exit_code == 0, result.output
    sent = json.loads(result.output)
    with psycopg.connect(postgres_conninfo) as conn:
        row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    db_now = row[0]
    store = PostgresDelayedMessageStore(postgres_conninfo)
    stored = store.get(sent["message_id"])
    store.close()
    assert stored is not None
    # due = database now() + 2 h at the time of the send (a little before our SELECT now())
    assert timedelta(hours=2) - timedelta(seconds=30) <= stored.due_at - db_now <= timedelta(hours=2)

    pending = json.loads(runner.invoke(app, ["pending", "--store", url, "--json"]).output)
    assert pending["pending"] == 1
    assert runner.invoke(app, ["cancel", sent["message_id"], "--store", url]).exit_code == 0
