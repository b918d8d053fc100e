"""``pending`` shows the release caps in force (``DELAYED_DELIVERY_RELEASE_RATES``, what the dispatchers read)."""

from __future__ import annotations

from pathlib import Path

import pytest

from delayed_delivery.release import RELEASE_RATES_ENV
from tests.app.cli.conftest import ok_json, one_line_error, run

RATES = '{"orders": 200, "*": 1000, "audit": null, "billing": 2.5}'


@pytest.fixture
def db(tmp_path: Path) -> str:
    store = f"sqlite:///{tmp_path / 'd.db'}"
    ok_json("send", "--store", store, "--to", "orders", "--delay", "2d", "--body", "x")
    return store


def test_pending_names_each_capped_destination_and_its_rate_on_one_line(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(RELEASE_RATES_ENV, RATES)
    result = run("pending", "--store", db)
    assert result.exit_code == 0, result.output
    [line] = [line for line in result.stdout.splitlines() if line.startswith("release control")]
    assert line == (
        f"release control ({RELEASE_RATES_ENV}): billing 2.5/s; orders 200/s; every other destination 1000/s; "
        "not capped: audit"
    )
    document = ok_json("pending", "--store", db)
    assert document["pending"] == 1
    assert document["release_rates"] == {"orders": 200, "*": 1000, "audit": None, "billing": 2.5}


def test_without_release_rates_pending_says_nothing_of_them(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(RELEASE_RATES_ENV, raising=False)
    result = run("pending", "--store", db)
    assert result.exit_code == 0 and "release control" not in result.stdout
    assert "release_rates" not in ok_json("pending", "--store", db)


def test_a_bad_release_rates_value_is_one_error_line(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RELEASE_RATES_ENV, '{"orders": "fast"}')
    one_line_error(run("pending", "--store", db), RELEASE_RATES_ENV, "orders")
