"""User mistakes: one line on stderr, exit code 2, never a traceback (no emulator needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.app.cli.conftest import one_line_error, run


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'd.db'}"


def test_bad_duration(db: str) -> None:
    one_line_error(
        run("send", "--store", db, "--to", "orders", "--delay", "10x", "--body", "a"), "cannot read duration"
    )


def test_missing_body_file(db: str, tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    one_line_error(run("send", "--store", db, "--to", "orders", "--delay", "1h", "--body", f"@{missing}"), "nope.json")


def test_delay_and_at_together(db: str) -> None:
    result = run("send", "--store", db, "--to", "q", "--delay", "1h", "--at", "2030-01-01T00:00:00Z", "--body", "a")
    one_line_error(result, "exactly one of --delay or --at")


def test_unreadable_at(db: str) -> None:
    one_line_error(run("reschedule", "x", "--store", db, "--at", "tomorrow"), "ISO-8601")


def test_unknown_cloud() -> None:
    one_line_error(run("pending", "--cloud", "gcp"), "use aws or azure")


def test_local_without_a_cloud() -> None:
    one_line_error(run("pending", "--local"), "--local needs --cloud")


def test_no_route_at_all(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DELAYED_DELIVERY_STORE", raising=False)
    monkeypatch.delenv("DELAYED_DELIVERY_CLOUD", raising=False)
    one_line_error(run("cancel", "abc"), "--store URL", "--cloud aws|azure")


def test_unknown_store_scheme() -> None:
    one_line_error(run("pending", "--store", "mysql://x"), "unknown store URL")


def test_cancel_of_a_missing_message(db: str) -> None:
    one_line_error(run("cancel", "nope", "--store", db), "no pending message 'nope'")


def test_bad_bucket(db: str) -> None:
    one_line_error(run("pending", "--store", db, "--by", "week"), "--by must be hour or day")


def test_cancellable_only_on_azure(db: str) -> None:
    one_line_error(run("send", "--store", db, "--to", "q", "--delay", "1h", "--body", "a", "--cancellable"), "azure")


def test_azure_without_a_storage_account(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "DELAYED_DELIVERY_STORAGE_CONNECTION_STRING",
        "DELAYED_DELIVERY_STORAGE_ACCOUNT",
        "AzureWebJobsStorage",
    ):
        monkeypatch.delenv(name, raising=False)
    one_line_error(run("pending", "--cloud", "azure"), "no storage account")


def test_unreachable_local_emulator_gives_a_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    # nothing listens on this port: the route fails fast with a hint to start the emulators
    result = run("pending", "--cloud", "aws", "--local", "--endpoint-url", "http://127.0.0.1:9")
    one_line_error(result, "local up")


@pytest.mark.parametrize("command", ["send", "pending", "cancel", "reschedule", "cost", "demo", "local up"])
def test_every_command_has_help_with_an_example(command: str) -> None:
    result = run(*command.split(), "--help")
    assert result.exit_code == 0
    assert "Example" in result.output and f"delayed-delivery {command.split()[0]}" in result.output
    assert "--json" in result.output
