"""Operator commands against the SQLite store: send, pending, cancel, reschedule and their errors."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from delayed_delivery import SqliteDelayedMessageStore
from delayed_delivery.app.cli import app

runner = CliRunner()


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/ops.db"


def run(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output


def test_send_then_pending_cancel_and_reschedule(url: str, tmp_path: Path) -> None:
    body_file = tmp_path / "body.bin"
    body_file.write_bytes(b"\x00\x01binary")
    code, out = run("send", "--store", url, "--to", "orders", "--delay", "40d", "--body", "hi", "-H", "k=v", "--json")
    assert code == 0, out
    first = json.loads(out)
    assert first["route"] == "store" and first["destination"] == "orders"
    code, out = run(
        "send",
        "--store",
        url,
        "--to",
        "billing",
        "--at",
        "2020-01-01T00:00:00Z",
        "--body",
        f"@{body_file}",
        "--id",
        "late-one",
        "--json",
    )
    assert code == 0, out

    store = SqliteDelayedMessageStore(url[len("sqlite:///") :])
    stored = store.get(first["message_id"])
    assert stored is not None and stored.body == b"hi" and dict(stored.headers) == {"k": "v"}
    late = store.get("late-one")
    assert late is not None and late.body == b"\x00\x01binary"

    code, out = run("pending", "--store", url, "--json")
    data = json.loads(out)
    assert code == 0 and data["pending"] == 2
    assert data["next_due"].startswith("2020-01-01")
    assert data["oldest_overdue_seconds"] > 365 * 86400
    assert sum(b["count"] for b in data["backlog"]) == 2

    code, out = run("reschedule", "late-one", "--at", "2031-05-01T12:00:00+02:00", "--store", url)
    assert code == 0, out
    moved = store.get("late-one")
    assert moved is not None and moved.due_at == datetime(2031, 5, 1, 10, tzinfo=UTC)

    assert run("cancel", "late-one", "--store", url)[0] == 0
    assert store.get("late-one") is None
    code, out = run("cancel", "late-one", "--store", url)
    assert code == 2 and "no pending message" in out


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["send", "--to", "q", "--delay", "2x", "--body", "b"], "cannot read duration"),
        (["send", "--to", "q", "--delay", "1h", "--body", "@/definitely/missing"], "cannot read body file"),
        (["send", "--to", "q", "--body", "b"], "exactly one of --delay or --at"),
        (["send", "--to", "q", "--at", "tomorrow", "--body", "b"], "ISO-8601"),
        (["send", "--to", "q", "--at", "2030-01-01T00:00:00", "--body", "b"], "naive"),
        (["send", "--to", "", "--delay", "1h", "--body", "b"], "destination"),
        (["send", "--to", "q", "--delay", "1h", "--body", "b", "-H", "novalue"], "key=value"),
        (["pending", "--by", "week"], "hour or day"),
        (["reschedule", "nope", "--delay", "1h"], "no pending message"),
    ],
)
def test_user_mistakes_are_one_line_and_exit_2(url: str, args: list[str], needle: str) -> None:
    code, out = run(*args, "--store", url)
    assert code == 2, out
    assert needle in out
    assert "Traceback" not in out


def test_unknown_store_url_is_a_clear_error() -> None:
    code, out = run("pending", "--store", "mysql://x")
    assert code == 2 and "unknown store URL" in out
