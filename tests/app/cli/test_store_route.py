"""The SQL store route end to end on SQLite: send, pending, reschedule, cancel."""

from __future__ import annotations

from pathlib import Path

from tests.app.cli.conftest import ok_json, run


def test_send_pending_reschedule_cancel_on_sqlite(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'd.db'}"
    body = tmp_path / "body.json"
    body.write_text('{"id": 7}')
    sent = ok_json("send", "--store", db, "--to", "orders", "--delay", "2d", "--body", f"@{body}", "-H", "k=v")
    assert sent["route"] == "store" and sent["destination"] == "orders"
    ok_json("send", "--store", db, "--to", "orders", "--at", "2030-01-01T00:00:00Z", "--body", "later")
    pending = ok_json("pending", "--store", db, "--by", "day")
    assert pending["pending"] == 2 and len(pending["backlog"]) == 2 and pending["oldest_overdue_seconds"] == 0
    moved = ok_json("reschedule", sent["message_id"], "--store", db, "--at", "2030-01-01T05:00:00Z")
    assert moved["due_at"].startswith("2030-01-01T05:00")
    pending = ok_json("pending", "--store", db)
    assert [b["count"] for b in pending["backlog"]] == [2]
    cancelled = ok_json("cancel", sent["message_id"], "--store", db)
    assert cancelled == {"message_id": sent["message_id"], "cancelled": True, "route": "store"}
    assert ok_json("pending", "--store", db)["pending"] == 1
    text = run("pending", "--store", db, "--by", "hour")
    assert text.exit_code == 0 and "2030-01-01 00:00" in text.stdout
